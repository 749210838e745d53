"""The engine loop: one thread owns the LLMEngine; handlers post commands to its inbox and get their outputs back
through their Sinks, so no model step ever runs on the event loop."""
from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import queue
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from seq2seq_engine.engine_port import EnginePort
from seq2seq_engine.entrypoints.openai.core_share import CoreShare
from seq2seq_engine.entrypoints.openai.metrics import ServerMetrics
from seq2seq_engine.entrypoints.openai.sink import Accepted, Failed, InputProgress, InputResult, JobDone, Rejected, Sink

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class _Add:
    request_id: str
    prompt: Any
    params: Any
    sink: Sink
    lora_request: Any = None  # a LoRARequest: the adapter the request runs with


@dataclasses.dataclass(frozen=True)
class _AddJob:
    job_id: str
    job: Any  # a seq2seq_engine.transcription.job.TranscriptionJob
    sink: Sink


@dataclasses.dataclass(frozen=True)
class _Abort:
    request_ids: Tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class _Call:
    fn: Callable[[EnginePort], Any]
    future: concurrent.futures.Future


_STOP = object()


class EngineLoop:
    """Runs `engine.step()` while any request or transcription job is unfinished, and sleeps on its inbox otherwise.
    Only this thread calls the engine's add_request / step / abort_request; every other thread uses the methods
    below, which only post to the inbox. Loops of one process that share `cores` divide its threads among those
    with work before each step."""

    def __init__(self, engine: EnginePort, metrics: ServerMetrics, cores: Optional[CoreShare] = None) -> None:
        self.engine, self.metrics = engine, metrics
        self._cores = cores
        self._inbox: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self._sinks: Dict[str, Sink] = {}
        self._jobs: Dict[str, Tuple[Any, Sink]] = {}
        self._thread = threading.Thread(target=self._run, name="seq2seq-engine-loop", daemon=True)

    # ---------------------------------------------------------------- any thread
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: Optional[float] = None) -> None:
        """Abort everything in flight and end the thread."""
        self._inbox.put(_STOP)
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def requests_in_flight(self) -> int:
        """Requests the loop has added and not yet finished (readable from any thread: one length read)."""
        return len(self._sinks)

    def add_request(self, request_id: str, prompt: Any, params: Any, sink: Sink, lora_request: Any = None) -> None:
        """The sink gets Accepted or Rejected, then each RequestOutput of the request (the last one finished);
        `lora_request`: the LoRA adapter it runs with (None: the base model)."""
        self._inbox.put(_Add(request_id, prompt, params, sink, lora_request))

    def add_job(self, job_id: str, job: Any, sink: Sink) -> None:
        """The sink gets Accepted, an InputResult per finished input, then JobDone (or Failed)."""
        self._inbox.put(_AddJob(job_id, job, sink))

    def abort(self, *request_ids: str) -> None:
        """Abort requests or jobs (by id); unknown or finished ids are ignored."""
        self._inbox.put(_Abort(tuple(request_ids)))

    def call(self, fn: Callable[[EnginePort], Any]) -> concurrent.futures.Future:
        """Run fn(engine) on the loop thread between two steps (e.g. to read the block pools consistently)."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._inbox.put(_Call(fn, future))
        return future

    # ---------------------------------------------------------------- the loop thread
    def _run(self) -> None:
        try:
            while self._handle_inbox(block=not self._busy()):
                self._fill_jobs()
                if self.engine.has_unfinished_requests():
                    self._share_cores()
                    self._step()
                self._collect_jobs()
                self.metrics.engine_state(self.engine)
        finally:
            if self._cores is not None:
                self._cores.release(id(self))
            self._abort_all()

    def _busy(self) -> bool:
        return bool(self._jobs) or self.engine.has_unfinished_requests()

    def _share_cores(self) -> None:
        """Run this step with this loop's share of the process's threads (set on this thread only). The count is
        read back first: torch's first read on a thread initialises it from the process-wide last value set."""
        if self._cores is None:
            return
        threads = self._cores.threads_for_step(id(self))
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)

    def _handle_inbox(self, block: bool) -> bool:
        """Apply every queued command (waiting for one when idle); False once asked to stop."""
        if block and self._cores is not None:
            self._cores.release(id(self))
        while True:
            try:
                command = self._inbox.get(block=block)
            except queue.Empty:
                return True
            block = False
            if command is _STOP:
                return False
            self._apply(command)

    def _apply(self, command: Any) -> None:
        if isinstance(command, _Add):
            adapter = {} if command.lora_request is None else {"lora_request": command.lora_request}
            try:
                self.engine.add_request(command.request_id, command.prompt, command.params, **adapter)
            except (ValueError, TypeError) as error:  # refused (bad prompt or params): the client's error
                command.sink.put(Rejected(command.request_id, error))
                return
            except Exception as error:
                logger.exception("adding request %s failed", command.request_id)
                command.sink.put(Failed(command.request_id, f"{type(error).__name__}: {error}"))
                return
            self._sinks[command.request_id] = command.sink
            self.metrics.request_added(command.request_id)
            command.sink.put(Accepted(command.request_id))
        elif isinstance(command, _AddJob):
            self._jobs[command.job_id] = (command.job, command.sink)
            command.sink.put(Accepted(command.job_id))
        elif isinstance(command, _Abort):
            self._abort(command.request_ids)
        elif isinstance(command, _Call):
            try:
                command.future.set_result(command.fn(self.engine))
            except Exception as error:
                command.future.set_exception(error)

    def _abort(self, ids: Tuple[str, ...]) -> None:
        requests = [request_id for request_id in ids if self._sinks.pop(request_id, None) is not None]
        if requests:
            self.engine.abort_request(requests)
            for request_id in requests:
                self.metrics.request_aborted(request_id)
        for job_id in ids:
            if job_id in self._jobs:
                job, _ = self._jobs.pop(job_id)
                job.abort()
                job.close()

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as error:  # a bug, not a client error: fail what was running, keep serving
            logger.exception("engine step failed; aborting the requests in flight")
            self._fail_all(f"the engine failed: {type(error).__name__}: {error}")
            return
        stepped: Dict[str, None] = {}  # the jobs that got outputs, in order
        for output in outputs:
            sink = self._sinks.get(output.request_id)
            if sink is not None:
                self.metrics.request_output(output)
                sink.put(output)
                if output.finished:
                    del self._sinks[output.request_id]
                continue
            for job_id, (job, job_sink) in list(self._jobs.items()):
                if job.owns(output.request_id):
                    self._run_job(job_id, job, job_sink, job.on_output, output)
                    stepped[job_id] = None
                    break
        for job_id in stepped:  # each job acts on its outputs of the step (TranscriptionJob.end_of_step)
            if job_id in self._jobs:
                job, job_sink = self._jobs[job_id]
                self._run_job(job_id, job, job_sink, job.end_of_step)

    def _fill_jobs(self) -> None:
        """Let each job queue its requests; a job with nothing in flight after that is done (as in pipeline.py: a
        retry queued by on_output is only admitted here, so "nothing in flight" is judged after fill only)."""
        for job_id, (job, sink) in list(self._jobs.items()):
            if not self._run_job(job_id, job, sink, job.fill):
                continue
            if not job.in_flight:
                self._collect(job, sink)
                del self._jobs[job_id]
                job.close()
                sink.put(JobDone(job_id))

    def _collect_jobs(self) -> None:
        """Hand each job's finished inputs to its handler."""
        for job, sink in list(self._jobs.values()):
            self._collect(job, sink)

    def _collect(self, job: Any, sink: Sink) -> None:
        for index, segments, text in job.take_progress():  # before take_finished, which drops the windows
            sink.put(InputProgress(index, segments, text))
        for index, result in job.take_finished():
            self.metrics.audio_done(result.duration)
            sink.put(InputResult(index, result))

    def _run_job(self, job_id: str, job: Any, sink: Sink, method: Callable, *args: Any) -> bool:
        """Call one of the job's methods; an exception fails the job (False), not the loop."""
        try:
            method(*args)
            return True
        except Exception as error:
            logger.exception("transcription job %s failed", job_id)
            self._jobs.pop(job_id, None)
            job.abort()
            job.close()
            sink.put(Failed(job_id, f"{type(error).__name__}: {error}"))
            return False

    def _fail_all(self, message: str, status: int = 500) -> None:
        request_ids: List[str] = list(self._sinks)
        for request_id in request_ids:
            self._sinks.pop(request_id).put(Failed(request_id, message, status))
        if request_ids:
            self.engine.abort_request(request_ids)
        for job_id, (job, sink) in list(self._jobs.items()):
            job.abort()
            job.close()
            sink.put(Failed(job_id, message, status))
        self._jobs.clear()
        # Whatever the engine still holds belongs to nobody now.
        leftovers = self.engine.unfinished_request_ids()
        if leftovers:
            self.engine.abort_request(leftovers)

    def _abort_all(self) -> None:
        self._fail_all("the server is shutting down", 503)
        while True:  # answer calls that raced with the stop
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(command, _Call):
                command.future.cancel()
            elif isinstance(command, (_Add, _AddJob)):
                command.sink.put(Failed(getattr(command, "request_id", getattr(command, "job_id", "")),
                                        "the server is shutting down", 503))
