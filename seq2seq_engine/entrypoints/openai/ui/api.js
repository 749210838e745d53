// The page's way to the API: the key (sessionStorage only), authorised requests, the server's error messages and
// server-sent events.

const KEY_NAME = "seq2seq-engine.api-key";

export function apiKey() {
  return sessionStorage.getItem(KEY_NAME) || "";
}

export function setApiKey(key) {
  if (key) sessionStorage.setItem(KEY_NAME, key);
  else sessionStorage.removeItem(KEY_NAME);
}

// An API error: `message` as the server words it (OpenAI's error.message).
export class ApiError extends Error {
  constructor(message, status) {
    super(message);
    this.status = status;
  }
}

async function errorOf(response) {
  const text = await response.text();
  try {
    const message = JSON.parse(text).error.message;
    if (message) return new ApiError(message, response.status);
  } catch (ignored) { /* not an OpenAI-style error body */ }
  return new ApiError(`${response.status} ${response.statusText}: ${text.slice(0, 300)}`, response.status);
}

// fetch() with the key as `Authorization: Bearer ...`; a non-2xx answer throws its ApiError.
export async function api(path, options = {}) {
  const headers = {...(options.headers || {})};
  const key = apiKey();
  if (key) headers.Authorization = `Bearer ${key}`;
  const response = await fetch(path, {...options, headers});
  if (!response.ok) throw await errorOf(response);
  return response;
}

// The JSON events of a text/event-stream response, up to `data: [DONE]`; an error event throws its ApiError.
export async function* events(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) return;
    buffer = (buffer + decoder.decode(value, {stream: true})).replace(/\r\n/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = block.split("\n").filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).trimStart()).join("\n");
      if (!data) continue;
      if (data === "[DONE]") return;
      const event = JSON.parse(data);
      if (event.error) throw new ApiError(event.error.message, event.error.code);
      yield event;
    }
  }
}

// Show an error's message in `element` (hidden while there is none); AbortError (the user's Stop) shows nothing.
export function showError(element, error) {
  const message = error && error.name !== "AbortError" ? error.message || String(error) : "";
  element.textContent = message;
  element.hidden = !message;
}

export function $(selector, root = document) {
  return root.querySelector(selector);
}
