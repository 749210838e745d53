// The page: the API key, the served models from GET /v1/models (audio models for the audio sections, text models
// for the prompt box; a section without a model of its kind says so and stays disabled), and the three sections.

import {$, api, apiKey, setApiKey, showError} from "./api.js";
import {setupLive} from "./live.js";
import {setupText} from "./text.js";
import {setupTranscription} from "./transcribe.js";

const SECTIONS = [
  ["#file-section", "audio", "This server serves no Whisper (audio) model, so it cannot transcribe files."],
  ["#live-section", "audio", "This server serves no Whisper (audio) model, so it cannot caption the microphone."],
  ["#text-section", "text", "This server serves no text model, so it cannot complete prompts."],
];

function fill(select, cards) {
  const previous = select.value;
  select.replaceChildren(...cards.map((card) => {
    const label = card.parent ? `${card.id} (adapter on ${card.parent})` : card.id;
    return new Option(label, card.id);
  }));
  if (cards.some((card) => card.id === previous)) select.value = previous;
}

function enable(cards) {
  const byKind = {audio: [], text: []};
  for (const card of cards || []) (byKind[card.kind] || byKind.text).push(card);
  for (const select of document.querySelectorAll(".audio-models")) fill(select, byKind.audio);
  for (const select of document.querySelectorAll(".text-models")) fill(select, byKind.text);
  for (const [selector, kind, missing] of SECTIONS) {
    const section = $(selector);
    const none = cards !== null && byKind[kind].length === 0;
    $(".notice", section).textContent = none ? missing : "";
    $(".notice", section).hidden = !none;
    $("fieldset", section).disabled = cards === null || none;
  }
}

let loads = 0; // the latest loadModels call's number: an older answer arriving late is dropped

async function loadModels() {
  const status = $("#models-status");
  const load = ++loads;
  showError($("#key-error"), null);
  status.textContent = "Loading models…";
  try {
    const cards = (await (await api("/v1/models")).json()).data;
    if (load !== loads) return;
    enable(cards);
    status.textContent = `${cards.length} model${cards.length === 1 ? "" : "s"}: ${cards.map((c) => c.id).join(", ")}`;
  } catch (caught) {
    if (load !== loads) return;
    enable(null);
    status.textContent = "";
    showError($("#key-error"), caught);
  }
}

function setup() {
  const field = $("#api-key");
  field.value = apiKey();
  $("#key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    setApiKey(field.value.trim());
    loadModels();
  });
  setupTranscription();
  setupLive();
  setupText();
  loadModels();
}

setup();
