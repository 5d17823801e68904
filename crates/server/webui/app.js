// cachefit's chat page: plain JavaScript, no framework, no build step, no
// requests but to the server that sent it (its Content-Security-Policy
// forbids any other).
//
// Conversations and settings live in this browser's localStorage; the
// server keeps nothing. Replies stream from /v1/chat/completions as
// server-sent events; Stop aborts the fetch, and the server cancels the
// generation when the connection closes.
//
// Model text never goes through an HTML parser: the markdown renderer below
// builds DOM nodes and puts text in with textContent, so markup in a reply
// shows as text.
"use strict";

const STORE = {
  conversations: "cachefit.conversations",
  current: "cachefit.current",
  settings: "cachefit.settings",
  apiKey: "cachefit.apiKey",
};

const DEFAULT_SETTINGS = {
  model: "",
  temperature: 0.8,
  top_p: 0.95,
  max_tokens: 512,
  system: "",
};

const $ = (id) => document.getElementById(id);

function load(key, fallback) {
  try {
    const v = localStorage.getItem(key);
    return v === null ? fallback : JSON.parse(v);
  } catch (e) {
    return fallback;
  }
}

function save(key, value) {
  try {
    localStorage.setItem(key, JSON.stringify(value));
  } catch (e) {
    showStatus("Could not save to the browser's storage: " + e.message, true);
  }
}

const state = {
  conversations: load(STORE.conversations, []),
  currentId: load(STORE.current, null),
  settings: Object.assign({}, DEFAULT_SETTINGS, load(STORE.settings, {})),
  apiKey: localStorage.getItem(STORE.apiKey) || "",
  // The reply being streamed: {controller, message, element}.
  streaming: null,
  // A message to send again once the user has given the API key.
  pendingText: null,
};

// ---------------------------------------------------------------------------
// Markdown: a small, safe subset (code fences, inline code, bold, italic,
// headings, lists, quotes, links), built as DOM nodes.

function el(tag, className, text) {
  const e = document.createElement(tag);
  if (className) e.className = className;
  if (text !== undefined) e.textContent = text;
  return e;
}

const FENCE = /^\s*(`{3,}|~{3,})\s*([\w+#.-]*)\s*$/;
const HEADING = /^(#{1,6})\s+(.*)$/;
const RULE = /^\s*([-*_])(\s*\1){2,}\s*$/;
const BULLET = /^(\s*)[-*+]\s+(.*)$/;
const NUMBERED = /^(\s*)(\d{1,9})[.)]\s+(.*)$/;
const QUOTE = /^\s*>\s?(.*)$/;

function renderMarkdown(text) {
  const out = document.createDocumentFragment();
  const lines = text.replace(/\r\n?/g, "\n").split("\n");
  let i = 0;
  let paragraph = [];
  const flush = () => {
    if (paragraph.length) {
      const p = el("p");
      renderInline(paragraph.join("\n"), p);
      out.appendChild(p);
      paragraph = [];
    }
  };
  while (i < lines.length) {
    const line = lines[i];
    let m;
    if ((m = line.match(FENCE))) {
      flush();
      const fence = m[1];
      const lang = m[2];
      const body = [];
      i++;
      // An unclosed fence (a reply still streaming) runs to the end.
      while (i < lines.length && !lines[i].trim().startsWith(fence)) {
        body.push(lines[i]);
        i++;
      }
      i++;
      out.appendChild(codeBlock(body.join("\n"), lang));
      continue;
    }
    if ((m = line.match(HEADING))) {
      flush();
      const h = el("h" + Math.min(m[1].length + 2, 6));
      renderInline(m[2], h);
      out.appendChild(h);
      i++;
      continue;
    }
    if (RULE.test(line)) {
      flush();
      out.appendChild(el("hr"));
      i++;
      continue;
    }
    if (QUOTE.test(line)) {
      flush();
      const body = [];
      while (i < lines.length && (m = lines[i].match(QUOTE))) {
        body.push(m[1]);
        i++;
      }
      const q = el("blockquote");
      q.appendChild(renderMarkdown(body.join("\n")));
      out.appendChild(q);
      continue;
    }
    if (BULLET.test(line) || NUMBERED.test(line)) {
      flush();
      const numbered = !BULLET.test(line);
      const list = el(numbered ? "ol" : "ul");
      if (numbered) {
        const start = parseInt(line.match(NUMBERED)[2], 10);
        if (start !== 1) list.start = start;
      }
      let item = null;
      while (i < lines.length) {
        const l = lines[i];
        const b = numbered ? l.match(NUMBERED) : l.match(BULLET);
        if (b) {
          item = el("li");
          renderInline(numbered ? b[3] : b[2], item);
          list.appendChild(item);
        } else if (l.trim() !== "" && /^\s+/.test(l) && item) {
          // An indented line continues the item.
          item.appendChild(document.createTextNode(" "));
          renderInline(l.trim(), item);
        } else {
          break;
        }
        i++;
      }
      out.appendChild(list);
      continue;
    }
    if (line.trim() === "") {
      flush();
    } else {
      paragraph.push(line);
    }
    i++;
  }
  flush();
  return out;
}

function codeBlock(code, lang) {
  const wrap = el("div", "code-block");
  const bar = el("div", "code-bar");
  bar.appendChild(el("span", "code-lang", lang || "code"));
  const copy = el("button", "copy", "Copy");
  copy.type = "button";
  copy.addEventListener("click", () => {
    if (navigator.clipboard) {
      navigator.clipboard.writeText(code).then(
        () => { copy.textContent = "Copied"; },
        () => { copy.textContent = "Copy failed"; },
      );
    }
  });
  bar.appendChild(copy);
  const pre = el("pre");
  const c = el("code", lang ? "language-" + lang : "", code);
  pre.appendChild(c);
  wrap.appendChild(bar);
  wrap.appendChild(pre);
  return wrap;
}

// Inline spans, longest-first alternatives: code, bold, italic, links.
const INLINE =
  /(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)|\*\*(?=\S)([\s\S]+?)\*\*|(?<!\w)__(?=\S)([\s\S]+?)__(?!\w)|(?<![\w*])\*(?=\S)([^*]+?)\*(?!\w)|(?<!\w)_(?=\S)([^_]+?)_(?!\w)|\[([^\]\n]+)\]\(([^)\s]+)\)|\n/g;

function renderInline(text, parent) {
  let last = 0;
  INLINE.lastIndex = 0;
  const matches = [...text.matchAll(INLINE)];
  for (const m of matches) {
    if (m.index > last) parent.appendChild(document.createTextNode(text.slice(last, m.index)));
    last = m.index + m[0].length;
    if (m[1] !== undefined) {
      parent.appendChild(el("code", "", m[2]));
    } else if (m[3] !== undefined || m[4] !== undefined) {
      const b = el("strong");
      renderInline(m[3] !== undefined ? m[3] : m[4], b);
      parent.appendChild(b);
    } else if (m[5] !== undefined || m[6] !== undefined) {
      const e = el("em");
      renderInline(m[5] !== undefined ? m[5] : m[6], e);
      parent.appendChild(e);
    } else if (m[7] !== undefined) {
      parent.appendChild(link(m[7], m[8]));
    } else {
      parent.appendChild(el("br"));
    }
  }
  if (last < text.length) parent.appendChild(document.createTextNode(text.slice(last)));
}

// Only web and mail links: `javascript:` and `data:` URLs stay text.
function link(label, url) {
  if (!/^(https?:|mailto:)/i.test(url)) {
    return document.createTextNode("[" + label + "](" + url + ")");
  }
  const a = el("a");
  a.href = url;
  a.target = "_blank";
  a.rel = "noopener noreferrer";
  renderInline(label, a);
  return a;
}

// ---------------------------------------------------------------------------
// Talking to the server.

class NeedsKey extends Error {}

function headers(json) {
  const h = {};
  if (json) h["Content-Type"] = "application/json";
  if (state.apiKey) h["Authorization"] = "Bearer " + state.apiKey;
  return h;
}

// The message of an OpenAI-shaped error body, else the status.
async function errorText(response) {
  const text = await response.text();
  try {
    const v = JSON.parse(text);
    if (v && v.error && v.error.message) return v.error.message;
  } catch (e) {
    // not JSON: fall through
  }
  return "HTTP " + response.status + (text ? ": " + text.slice(0, 200) : "");
}

async function api(path, options) {
  const response = await fetch(path, options);
  if (response.status === 401) {
    askForKey(state.apiKey ? "The server refused this API key." : "This server needs an API key.");
    throw new NeedsKey("API key needed");
  }
  return response;
}

async function loadModels() {
  try {
    const response = await api("v1/models", { headers: headers(false) });
    if (!response.ok) throw new Error(await errorText(response));
    const list = (await response.json()).data || [];
    const select = $("set-model");
    select.replaceChildren();
    for (const m of list) {
      const option = el("option", "", m.id);
      option.value = m.id;
      select.appendChild(option);
    }
    const ids = list.map((m) => m.id);
    if (!ids.includes(state.settings.model)) state.settings.model = ids[0] || "";
    select.value = state.settings.model;
    $("model-name").textContent = state.settings.model || "(no model)";
    showStatus("");
  } catch (e) {
    if (!(e instanceof NeedsKey)) showStatus("Cannot reach the server: " + e.message, true);
  }
}

// The request body for the current conversation (errors and empty
// replies left out).
function requestBody(conversation) {
  const s = state.settings;
  const messages = [];
  if (s.system.trim()) messages.push({ role: "system", content: s.system });
  for (const m of conversation.messages) {
    if (m.error || (m.role === "assistant" && !m.content)) continue;
    messages.push({ role: m.role, content: m.content });
  }
  const body = {
    messages,
    stream: true,
    stream_options: { include_usage: true },
  };
  if (s.model) body.model = s.model;
  const number = (v) => (v === "" || v === null || !isFinite(Number(v)) ? null : Number(v));
  if (number(s.temperature) !== null) body.temperature = number(s.temperature);
  if (number(s.top_p) !== null) body.top_p = number(s.top_p);
  if (number(s.max_tokens) !== null) body.max_tokens = Math.max(1, Math.round(number(s.max_tokens)));
  return body;
}

// Calls `onEvent` with each parsed `data:` payload of an SSE body.
async function readEvents(response, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = event
        .split("\n")
        .filter((l) => l.startsWith("data:"))
        .map((l) => l.slice(5).trimStart())
        .join("\n");
      if (data === "[DONE]") return;
      if (data) onEvent(JSON.parse(data));
    }
  }
}

async function send(text) {
  if (state.streaming || !text.trim()) return;
  const conversation = currentConversation(true);
  const user = { role: "user", content: text };
  conversation.messages.push(user);
  if (conversation.messages.length === 1) conversation.title = titleOf(text);
  const reply = { role: "assistant", content: "" };
  conversation.messages.push(reply);
  conversation.updated = Date.now();
  saveConversations();
  renderConversations();
  renderMessages();
  const element = $("messages").lastElementChild;
  const controller = new AbortController();
  state.streaming = { controller, message: reply, element };
  setBusy(true);

  const started = performance.now();
  let firstText = null;
  let chunks = 0;
  let usage = null;
  let updates = 0;
  let scheduled = false;
  // Re-render at most once a frame however fast chunks come.
  const update = () => {
    if (scheduled) return;
    scheduled = true;
    requestAnimationFrame(() => {
      scheduled = false;
      updates++;
      element.dataset.updates = String(updates);
      fillContent(element, reply);
      scrollToEnd();
    });
  };
  try {
    const response = await api("v1/chat/completions", {
      method: "POST",
      headers: headers(true),
      body: JSON.stringify(requestBody(conversation)),
      signal: controller.signal,
    });
    if (!response.ok) throw new Error(await errorText(response));
    await readEvents(response, (v) => {
      if (v.error) throw new Error(v.error.message || "the server reported an error");
      if (v.usage) usage = v.usage;
      const choice = (v.choices || [])[0];
      const delta = choice && choice.delta && choice.delta.content;
      if (delta) {
        if (firstText === null) firstText = performance.now();
        chunks++;
        reply.content += delta;
        update();
      }
      if (choice && choice.finish_reason) reply.finish = choice.finish_reason;
    });
  } catch (e) {
    if (e instanceof NeedsKey) {
      // Take the turn back; it is sent again once the key is given.
      conversation.messages.splice(conversation.messages.indexOf(user), 2);
      state.pendingText = text;
    } else if (e.name === "AbortError") {
      reply.stopped = true;
    } else {
      reply.error = e.message;
      // Close the stream, if one is open, so the server stops generating.
      controller.abort();
    }
  }
  const ended = performance.now();
  reply.stats = stats(started, firstText, ended, chunks, usage);
  state.streaming = null;
  setBusy(false);
  conversation.updated = Date.now();
  saveConversations();
  renderConversations();
  renderMessages();
  const last = $("messages").lastElementChild;
  if (last) last.dataset.updates = String(updates);
  $("input").focus();
}

// Tokens per second of a reply. With `stream_options.include_usage` the
// server's last event counts the tokens (`usage.completion_tokens`); a
// stopped reply has no such event, so its chunks are counted instead (a
// chunk holds one token or more: the server batches tokens made within
// --stream-interval). Time is wall time from sending the request to the
// last event, so it includes reading the prompt.
function stats(started, firstText, ended, chunks, usage) {
  if (firstText === null) return null;
  const seconds = Math.max((ended - started) / 1000, 0.001);
  const counted = !usage;
  const tokens = counted ? chunks : usage.completion_tokens;
  return {
    tokens,
    seconds,
    tokensPerSecond: tokens / seconds,
    firstTextSeconds: (firstText - started) / 1000,
    counted,
  };
}

function statsText(s) {
  const rate = s.tokensPerSecond >= 100 ? s.tokensPerSecond.toFixed(0) : s.tokensPerSecond.toFixed(1);
  const what = s.counted ? "≥" + s.tokens + " tokens (chunks counted)" : s.tokens + " tokens";
  return what + " · " + rate + " tok/s · " + s.seconds.toFixed(2) + " s · first text " +
    s.firstTextSeconds.toFixed(2) + " s";
}

function stop() {
  if (state.streaming) state.streaming.controller.abort();
}

// ---------------------------------------------------------------------------
// Conversations.

function newId() {
  return Date.now().toString(36) + Math.random().toString(36).slice(2, 8);
}

function titleOf(text) {
  const t = text.trim().replace(/\s+/g, " ");
  return t.length > 40 ? t.slice(0, 40) + "…" : t || "New chat";
}

function currentConversation(create) {
  let c = state.conversations.find((x) => x.id === state.currentId);
  if (!c && create) {
    c = { id: newId(), title: "New chat", messages: [], updated: Date.now() };
    state.conversations.unshift(c);
    state.currentId = c.id;
    save(STORE.current, c.id);
  }
  return c;
}

function saveConversations() {
  save(STORE.conversations, state.conversations);
  save(STORE.current, state.currentId);
}

function selectConversation(id) {
  if (state.streaming) return;
  state.currentId = id;
  save(STORE.current, id);
  renderConversations();
  renderMessages();
}

function deleteConversation(id) {
  if (state.streaming) return;
  state.conversations = state.conversations.filter((c) => c.id !== id);
  if (state.currentId === id) state.currentId = state.conversations.length ? state.conversations[0].id : null;
  saveConversations();
  renderConversations();
  renderMessages();
}

function newConversation() {
  if (state.streaming) return;
  state.currentId = null;
  save(STORE.current, null);
  renderConversations();
  renderMessages();
  $("input").focus();
}

// ---------------------------------------------------------------------------
// Rendering.

function renderConversations() {
  const list = $("conversations");
  list.replaceChildren();
  const sorted = [...state.conversations].sort((a, b) => b.updated - a.updated);
  for (const c of sorted) {
    const li = el("li", c.id === state.currentId ? "active" : "");
    li.dataset.id = c.id;
    const open = el("button", "open", c.title || "New chat");
    open.type = "button";
    open.title = c.title || "";
    open.addEventListener("click", () => selectConversation(c.id));
    const del = el("button", "delete", "×");
    del.type = "button";
    del.title = "Delete this conversation";
    del.setAttribute("aria-label", "Delete " + (c.title || "conversation"));
    del.addEventListener("click", () => deleteConversation(c.id));
    li.appendChild(open);
    li.appendChild(del);
    list.appendChild(li);
  }
}

function fillContent(element, message) {
  const content = element.querySelector(".content");
  content.replaceChildren();
  if (message.role === "assistant") {
    content.appendChild(renderMarkdown(message.content));
  } else {
    content.textContent = message.content;
  }
}

function messageElement(message) {
  const div = el("div", "msg " + message.role);
  div.appendChild(el("div", "role", message.role === "user" ? "You" : "Assistant"));
  div.appendChild(el("div", "content"));
  fillContent(div, message);
  const notes = [];
  if (message.stats) notes.push(statsText(message.stats));
  if (message.stopped) notes.push("stopped");
  else if (message.finish === "length") notes.push("cut at max tokens");
  if (notes.length) div.appendChild(el("div", "stats", notes.join(" · ")));
  if (message.error) div.appendChild(el("div", "error", message.error));
  return div;
}

function renderMessages() {
  const box = $("messages");
  box.replaceChildren();
  const c = currentConversation(false);
  if (!c || !c.messages.length) {
    box.appendChild(el("div", "empty", "Start a conversation below."));
    return;
  }
  for (const m of c.messages) box.appendChild(messageElement(m));
  scrollToEnd();
}

function scrollToEnd() {
  const box = $("messages");
  box.scrollTop = box.scrollHeight;
}

function setBusy(busy) {
  $("send").hidden = busy;
  $("stop").hidden = !busy;
  document.body.classList.toggle("busy", busy);
}

function showStatus(text, isError) {
  const s = $("server-status");
  s.textContent = text;
  s.classList.toggle("error", !!isError);
}

function askForKey(why) {
  showStatus(why, true);
  $("key-form").hidden = false;
  $("key-input").focus();
}

// ---------------------------------------------------------------------------
// Settings.

const SETTING_INPUTS = [
  ["set-temperature", "temperature"],
  ["set-top-p", "top_p"],
  ["set-max-tokens", "max_tokens"],
  ["set-system", "system"],
];

function bindSettings() {
  for (const [id, key] of SETTING_INPUTS) {
    const input = $(id);
    input.value = state.settings[key];
    input.addEventListener("input", () => {
      state.settings[key] = input.value;
      save(STORE.settings, state.settings);
    });
  }
  $("set-model").addEventListener("change", (e) => {
    state.settings.model = e.target.value;
    $("model-name").textContent = e.target.value;
    save(STORE.settings, state.settings);
  });
  $("toggle-settings").addEventListener("click", () => {
    const panel = $("settings");
    panel.hidden = !panel.hidden;
    $("toggle-settings").setAttribute("aria-expanded", String(!panel.hidden));
  });
  $("forget-key").addEventListener("click", () => {
    state.apiKey = "";
    localStorage.removeItem(STORE.apiKey);
    showStatus("API key forgotten.");
  });
}

function init() {
  bindSettings();
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    const input = $("input");
    const text = input.value;
    if (!text.trim() || state.streaming) return;
    input.value = "";
    send(text);
  });
  $("input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", stop);
  $("new-chat").addEventListener("click", newConversation);
  $("key-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const key = $("key-input").value.trim();
    if (!key) return;
    state.apiKey = key;
    localStorage.setItem(STORE.apiKey, key);
    $("key-input").value = "";
    $("key-form").hidden = true;
    showStatus("");
    loadModels();
    if (state.pendingText !== null) {
      const text = state.pendingText;
      state.pendingText = null;
      send(text);
    }
  });
  renderConversations();
  renderMessages();
  loadModels();
  $("input").focus();
}

init();
