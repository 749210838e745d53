// "Transcribe a file": an upload streamed back from /v1/audio/transcriptions (or /translations) as its segments
// are decoded, the chosen output format, and the downloads (each asked of the server in its response_format).

import {$, api, events, showError} from "./api.js";

// download button -> [response_format, file extension, MIME type]
const DOWNLOADS = {
  srt: ["srt", "srt", "application/x-subrip"],
  vtt: ["vtt", "vtt", "text/vtt"],
  txt: ["text", "txt", "text/plain"],
  json: ["verbose_json", "json", "application/json"],
};

let file = null;
let run = null; // {file, model, language, task}: what the transcript on the page was made of
let cache = new Map(); // response_format -> the server's answer for `run`
let controller = null;

function clock(seconds) {
  const whole = Math.max(0, seconds || 0);
  const minutes = Math.floor(whole / 60);
  const rest = (whole - minutes * 60).toFixed(2).padStart(5, "0");
  return `${String(minutes).padStart(2, "0")}:${rest}`;
}

function form(request, format, stream) {
  const body = new FormData();
  body.append("file", request.file, request.file.name);
  body.append("model", request.model);
  if (request.language) body.append("language", request.language);
  body.append("response_format", format);
  if (stream) body.append("stream", "true");
  return body;
}

function post(request, format, stream, signal) {
  const path = request.task === "translate" ? "/v1/audio/translations" : "/v1/audio/transcriptions";
  return api(path, {method: "POST", body: form(request, format, stream), signal});
}

async function answer(format) {
  if (!cache.has(format)) cache.set(format, await (await post(run, format, false)).text());
  return cache.get(format);
}

function addSegment(segment) {
  const item = document.createElement("li");
  const time = document.createElement("span");
  time.className = "time";
  time.textContent = `${clock(segment.start)} → ${clock(segment.end)}`;
  const text = document.createElement("span");
  text.className = "text";
  text.textContent = segment.text.trim();
  item.append(time, text);
  $("#segments").append(item);
}

function addText(text) {
  if (!text.trim()) return;
  const item = document.createElement("li");
  item.textContent = text.trim();
  $("#segments").append(item);
}

function setRunning(running) {
  $("#file-run").disabled = running || !file;
  $("#file-stop").disabled = !running;
  for (const button of document.querySelectorAll(".downloads button")) button.disabled = running || !run;
}

async function transcribe() {
  const error = $("#file-error");
  showError(error, null);
  $("#segments").replaceChildren();
  $("#file-result").hidden = true;
  run = {file, model: $("#file-model").value, language: $("#file-language").value.trim(),
    task: $("#file-task").value};
  cache = new Map();
  controller = new AbortController();
  setRunning(true);
  $("#file-status").textContent = "Transcribing…";
  try {
    const response = await post(run, "verbose_json", true, controller.signal);
    for await (const event of events(response)) {
      if (event.type === "transcript.text.delta") {
        if (event.segments && event.segments.length) event.segments.forEach(addSegment);
        else addText(event.delta || "");
      } else if (event.type === "transcript.text.done") {
        $("#file-status").textContent = `Done: ${event.usage ? event.usage.seconds : "?"} s of audio.`;
      }
    }
  } catch (caught) {
    run = null;
    $("#file-status").textContent = caught.name === "AbortError" ? "Stopped." : "";
    showError(error, caught);
  } finally {
    controller = null;
    setRunning(false);
  }
  await showFormat($("#file-format").value).catch((caught) => showError(error, caught));
}

async function showFormat(format) {
  const result = $("#file-result");
  result.hidden = !format || !run;
  if (result.hidden) return;
  result.textContent = "…";
  result.textContent = await answer(format);
}

async function download(name) {
  const [format, extension, type] = DOWNLOADS[name];
  try {
    showError($("#file-error"), null);
    const text = await answer(format);
    const link = document.createElement("a");
    link.href = URL.createObjectURL(new Blob([text], {type}));
    link.download = `${run.file.name.replace(/\.[^.]*$/, "") || "transcript"}.${extension}`;
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(link.href), 10000);
  } catch (caught) {
    showError($("#file-error"), caught);
  }
}

function choose(picked) {
  if (!picked) return;
  file = picked;
  $("#file-name").textContent = `${picked.name} (${(picked.size / 1024).toFixed(0)} KiB)`;
  setRunning(false);
}

export function setupTranscription() {
  const zone = $("#drop-zone");
  $("#file-input").addEventListener("change", (event) => choose(event.target.files[0]));
  zone.addEventListener("dragover", (event) => {
    event.preventDefault();
    zone.classList.add("over");
  });
  zone.addEventListener("dragleave", () => zone.classList.remove("over"));
  zone.addEventListener("drop", (event) => {
    event.preventDefault();
    zone.classList.remove("over");
    choose(event.dataTransfer.files[0]);
  });
  $("#file-run").addEventListener("click", transcribe);
  $("#file-stop").addEventListener("click", () => controller && controller.abort());
  $("#file-format").addEventListener("change", (event) => {
    showFormat(event.target.value).catch((caught) => showError($("#file-error"), caught));
  });
  for (const button of document.querySelectorAll(".downloads button")) {
    button.addEventListener("click", () => download(button.dataset.format));
  }
  setRunning(false);
}
