// "Live captions": the microphone streamed to /v1/realtime?intent=transcription as pcm16 at the session's rate; each
// turn's deltas show as interim text until its `.completed` transcript replaces them.

import {$, apiKey, showError} from "./api.js";

const RATE = 16000; // asked for in session.update; audio is sent at the rate session.updated confirms
const CHUNK_MS = 100;
const KEY_PROTOCOL = "openai-insecure-api-key."; // browsers cannot set headers on a WebSocket

let live = null; // the running session: {socket, stream, context, capturing, stopping}

function status(text) {
  $("#live-status").textContent = text;
}

function caption(itemId) {
  let line = document.querySelector(`#captions [data-item="${CSS.escape(itemId)}"]`);
  if (!line) {
    line = document.createElement("p");
    line.dataset.item = itemId;
    line.className = "interim";
    $("#captions").append(line);
  }
  return line;
}

function base64(buffer) {
  const bytes = new Uint8Array(buffer);
  let binary = "";
  for (let at = 0; at < bytes.length; at += 0x8000) {
    binary += String.fromCharCode.apply(null, bytes.subarray(at, at + 0x8000));
  }
  return btoa(binary);
}

function send(event) {
  if (live && live.socket.readyState === WebSocket.OPEN) live.socket.send(JSON.stringify(event));
}

function sessionUpdate() {
  const language = $("#live-language").value.trim() || null;
  return {type: "session.update", session: {type: "transcription", audio: {input: {
    format: {type: "audio/pcm", rate: RATE},
    transcription: {model: $("#live-model").value, language},
    turn_detection: {type: "server_vad"},
  }}}};
}

// An AudioContext with the worklet and the microphone: at `rate` where the browser resamples the microphone itself,
// else at the device's rate (the worklet resamples).
async function openContext(stream, rate) {
  for (const options of [{sampleRate: rate}, {}]) {
    let context = null;
    try {
      context = new AudioContext(options);
      await context.audioWorklet.addModule("/ui/pcm-worklet.js");
      return [context, context.createMediaStreamSource(stream)];
    } catch (caught) {
      if (context) context.close();
      if (!options.sampleRate) throw caught;
    }
  }
}

async function capture(current, rate) {
  const [context, source] = await openContext(current.stream, rate);
  current.context = context;
  if (live !== current) { // stopped meanwhile
    context.close();
    return;
  }
  const node = new AudioWorkletNode(context, "pcm16-capture", {processorOptions: {rate, chunkMs: CHUNK_MS}});
  node.port.onmessage = ({data}) => {
    if (!current.stopping) send({type: "input_audio_buffer.append", audio: base64(data)});
  };
  source.connect(node);
  node.connect(context.destination); // silent: it keeps the graph pulling audio through the worklet
  await context.resume();
  status(`Listening (${rate} Hz)…`);
}

function onEvent(current, event) {
  if (event.type === "session.created") {
    send(sessionUpdate());
  } else if (event.type === "session.updated" && !current.capturing) {
    current.capturing = true;
    capture(current, event.session.audio.input.format.rate).catch((caught) => fail(caught));
  } else if (event.type === "conversation.item.input_audio_transcription.delta") {
    caption(event.item_id).textContent += event.delta; // the deltas carry their own spaces
  } else if (event.type === "conversation.item.input_audio_transcription.completed") {
    const line = caption(event.item_id);
    line.textContent = event.transcript;
    line.className = "final";
    if (current.stopping) close();
  } else if (event.type === "error") {
    if (current.stopping) close();
    else showError($("#live-error"), event.error);
  }
}

function fail(error) {
  showError($("#live-error"), error);
  close();
}

function close() {
  const current = live;
  if (!current) return;
  live = null;
  current.stopping = true;
  for (const track of current.stream.getTracks()) track.stop();
  if (current.context) current.context.close();
  if (current.socket.readyState <= WebSocket.OPEN) current.socket.close(1000);
  $("#live-start").disabled = false;
  $("#live-stop").disabled = true;
  if (!$("#live-status").textContent.startsWith("Closed")) status("Stopped.");
}

// Stop sending, commit what was heard, and close once its transcript (or an error) arrives; 10 s at most.
function stop() {
  if (!live || live.stopping) return;
  live.stopping = true;
  status("Finishing the last words…");
  for (const track of live.stream.getTracks()) track.stop();
  send({type: "input_audio_buffer.commit"});
  setTimeout(close, 10000);
}

async function start() {
  showError($("#live-error"), null);
  $("#live-start").disabled = true;
  if (!navigator.mediaDevices || !window.AudioWorkletNode) {
    fail(new Error("The microphone needs a secure page: open it over https or on localhost."));
    return;
  }
  let stream;
  try {
    stream = await navigator.mediaDevices.getUserMedia(
      {audio: {channelCount: 1, echoCancellation: false, noiseSuppression: false, autoGainControl: false}});
  } catch (caught) {
    $("#live-start").disabled = false;
    showError($("#live-error"), new Error(`No microphone: ${caught.message}`));
    return;
  }
  const url = new URL(`/v1/realtime?intent=transcription&model=${encodeURIComponent($("#live-model").value)}`,
    location.href);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  const key = apiKey();
  let socket;
  try {
    socket = new WebSocket(url, key ? ["realtime", KEY_PROTOCOL + key] : ["realtime"]);
  } catch (caught) { // a key with characters a subprotocol cannot hold
    for (const track of stream.getTracks()) track.stop();
    $("#live-start").disabled = false;
    showError($("#live-error"), new Error(`The WebSocket cannot be opened: ${caught.message}`));
    return;
  }
  const current = {socket, stream, context: null, capturing: false, stopping: false};
  live = current;
  $("#live-stop").disabled = false;
  status("Connecting…");
  socket.onmessage = (message) => onEvent(current, JSON.parse(message.data));
  socket.onclose = (closed) => {
    if (live !== current) return;
    if (!current.stopping) {
      const reason = closed.reason ? `: ${closed.reason}` : "";
      status(`Closed by the server (code ${closed.code}${reason}).`);
      if (closed.code === 1006 && !current.context) {
        showError($("#live-error"), new Error("The server refused the connection: check the API key."));
      }
    }
    close();
  };
}

export function setupLive() {
  $("#live-start").addEventListener("click", start);
  $("#live-stop").addEventListener("click", stop);
}
