// "Text generation": a prompt streamed through /v1/completions, or a user message through /v1/chat/completions.

import {$, api, events, showError} from "./api.js";

let controller = null;

function request() {
  const chat = $("#text-mode").value === "chat";
  const prompt = $("#prompt").value;
  const body = {model: $("#text-model").value, stream: true};
  const maxTokens = parseInt($("#text-max-tokens").value, 10);
  const temperature = parseFloat($("#text-temperature").value);
  if (Number.isFinite(maxTokens)) body.max_tokens = maxTokens;
  if (Number.isFinite(temperature)) body.temperature = temperature;
  if (chat) body.messages = [{role: "user", content: prompt}];
  else body.prompt = prompt;
  return [chat ? "/v1/chat/completions" : "/v1/completions", body, chat];
}

async function generate() {
  const output = $("#text-output");
  const [path, body, chat] = request();
  showError($("#text-error"), null);
  output.textContent = "";
  controller = new AbortController();
  $("#text-run").disabled = true;
  $("#text-stop").disabled = false;
  $("#text-status").textContent = "Generating…";
  let chunks = 0;
  try {
    const response = await api(path, {method: "POST", headers: {"Content-Type": "application/json"},
      body: JSON.stringify(body), signal: controller.signal});
    let finish = null;
    for await (const event of events(response)) {
      const choice = event.choices && event.choices[0];
      if (!choice) continue;
      const text = chat ? (choice.delta && choice.delta.content) : choice.text;
      if (text) {
        output.textContent += text;
        chunks += 1;
      }
      finish = choice.finish_reason || finish;
    }
    $("#text-status").textContent = `Done: ${chunks} chunks streamed (finish reason: ${finish || "none"}).`;
  } catch (caught) {
    $("#text-status").textContent = caught.name === "AbortError" ? "Stopped." : "";
    showError($("#text-error"), caught);
  } finally {
    controller = null;
    $("#text-run").disabled = false;
    $("#text-stop").disabled = true;
  }
}

export function setupText() {
  $("#text-run").addEventListener("click", generate);
  $("#text-stop").addEventListener("click", () => controller && controller.abort());
  $("#prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey) && !$("#text-run").disabled) generate();
  });
}
