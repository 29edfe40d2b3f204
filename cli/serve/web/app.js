// The page of `kiln serve`. Generate queues a job (POST /v1/generate) and follows its server-sent events
// (GET /v1/jobs/{id}/events), read with fetch rather than EventSource so that an API key can travel in the
// Authorization header; the progress bar follows the steps, and each image joins the gallery with its
// parameters (a click puts them back in the form). Cancel, and leaving the page, cancel the job.
// The form's rows besides the prompt, the size and the seed are the selected model's fields, made from the
// schema GET /v1/models serves (each field's JSON name, label, kind, range, default and help): nothing here
// names a model family or a field it takes.
// A model that edits images (kiln.edits) gets an upload: the image is drawn on a canvas and sent as PNG at its
// own size, a mask painted over it makes the job an inpainting one, and the fields of the class that will run
// then (strength, ...) join the form.
"use strict";

const $ = (id) => document.getElementById(id);
// edit: while an image is loaded, { painted } (whether its mask has a stroke); the canvases hold both.
const page = { models: [], loras: [], job: null, stream: null, edit: null };
// Fields with rows of their own above.
const ownRows = new Set(["prompt", "height", "width", "seed"]);
// Fields the upload fills: no row for them.
const imageKinds = new Set(["image", "image list"]);
// The mask's strokes: opaque in their canvas, shown translucent over the image (app.css).
const maskColor = "#ff2d78";

function authHeaders(extra = {}) {
  const key = $("api-key").value.trim();
  return key ? { ...extra, Authorization: `Bearer ${key}` } : extra;
}

// fetch, throwing the server's error message (OpenAI's {"error": {"message"}}) for anything but 2xx.
async function api(path, options = {}) {
  const res = await fetch(path, { ...options, headers: authHeaders(options.headers) });
  if (!res.ok) {
    let message = `${res.status} ${res.statusText}`;
    try {
      message = (await res.json()).error.message;
    } catch (_) {}
    if (res.status === 401) $("api-key-row").hidden = false;
    throw new Error(message);
  }
  return res;
}

function showError(message) {
  $("error").textContent = message || "";
  $("error").hidden = !message;
}

function setStatus(text, step, steps) {
  $("status").textContent = text;
  if (steps !== undefined) {
    $("progress").max = steps;
    $("progress").value = step;
  }
}

function setBusy(busy) {
  $("generate").disabled = busy;
  $("cancel").disabled = !busy;
}

// ---- models

function selectedModel() {
  return page.models.find((m) => m.id === $("model").value);
}

// What the selected model does with an image: {image, mask, image_fields, mask_fields, ...} (GET /v1/models).
function modelEdits() {
  const model = selectedModel();
  return (model && model.kiln.edits) || {};
}

// Whether the job will be an inpainting one: a mask is painted and the model takes one.
function masking() {
  return page.edit !== null && page.edit.painted && modelEdits().mask === true;
}

// The selected model's fields that get a generated row; with an image, those the class that will run adds.
function modelFields() {
  const model = selectedModel();
  const fields = [...((model && model.kiln.fields) || [])];
  if (page.edit !== null) {
    const edits = modelEdits();
    for (const field of (masking() ? edits.mask_fields : edits.image_fields) || [])
      if (!fields.some((f) => f.json === field.json)) fields.push(field);
  }
  return fields.filter((f) => !ownRows.has(f.json) && !imageKinds.has(f.kind));
}

function fieldInput(field) {
  if (field.kind === "text") {
    const input = document.createElement("textarea");
    input.rows = 2;
    return input;
  }
  if (field.kind === "choice" || field.kind === "boolean") {
    const input = document.createElement("select");
    const choices = field.kind === "boolean" ? ["true", "false"] : field.choices;
    input.append(new Option("default", ""), ...choices.map((c) => new Option(c, c)));
    return input;
  }
  const input = document.createElement("input");
  if (field.kind === "integer" || field.kind === "number") {
    input.type = "number";
    if (field.min !== undefined) input.min = field.min;
    if (field.max !== undefined) input.max = field.max;
    input.step = field.kind === "integer" ? "1" : "any";
    input.inputMode = field.kind === "integer" ? "numeric" : "decimal";
  } else {
    input.placeholder = "1,2,3";  // an integer list
  }
  return input;
}

// The rows of the model's fields, with its defaults as placeholders.
function showModelFields() {
  const model = selectedModel();
  showEdit();
  const defaults = (model && model.kiln.defaults) || {};
  const [w, h] = (defaults.size || "x").split("x");
  $("width").placeholder = w || "default";
  $("height").placeholder = h || "default";
  const values = formFieldValues();  // what was typed survives a change of model where the field remains
  const rows = modelFields().map((field) => {
    const label = document.createElement("label");
    label.id = `row-${field.json}`;
    label.title = `${field.name}: ${field.help}`;
    label.className = field.kind === "text" ? "text" : "";
    const input = fieldInput(field);
    input.id = `field-${field.json}`;
    if (field.default !== undefined && "placeholder" in input) input.placeholder = field.default;
    else if (input.placeholder === "") input.placeholder = "default";
    if (values[field.json] !== undefined) input.value = values[field.json];
    label.append(field.label, " ", input);
    return label;
  });
  $("fields").replaceChildren(...rows);
  showLoras();
}

// ---- the image to edit

// The upload for a model that edits images (a model that does not drops the loaded image), the mask's tools
// for one that takes a mask.
function showEdit() {
  const edits = modelEdits();
  const takes = edits.image === true || edits.mask === true;
  if (!takes) {
    page.edit = null;
    $("edit-file").value = "";
  }
  $("edit").hidden = !takes;
  $("edit-view").hidden = page.edit === null;
  $("edit-remove").hidden = page.edit === null;
  $("mask-tools").hidden = page.edit === null || edits.mask !== true;
}

function maskContext() {
  return $("edit-mask").getContext("2d", { willReadFrequently: true });  // read back after each stroke
}

// Draws the chosen file at its own size, with an empty mask; the size fields take its size (the request then
// says it, rather than the model's default size).
async function loadImage(file) {
  const img = new Image();
  const url = URL.createObjectURL(file);
  try {
    img.src = url;
    await img.decode();
  } catch (_) {
    throw new Error(`${file.name}: not an image this browser reads`);
  } finally {
    URL.revokeObjectURL(url);
  }
  const { naturalWidth: w, naturalHeight: h } = img;
  for (const canvas of [$("edit-image"), $("edit-mask")]) {
    canvas.width = w;
    canvas.height = h;
  }
  $("edit-image").getContext("2d").drawImage(img, 0, 0);
  $("edit-view").classList.toggle("pixelated", Math.max(w, h) < 512);  // a small image's pixels, unblurred
  $("brush-size").max = Math.max(8, Math.round(Math.max(w, h) / 4));
  $("brush-size").value = Math.max(1, Math.round(Math.max(w, h) / 16));
  $("width").value = w;
  $("height").value = h;
  showResult(null);
  page.edit = { painted: false };
  showModelFields();
}

// Back to text-to-image.
function removeImage() {
  page.edit = null;
  $("edit-file").value = "";
  showModelFields();
}

function showResult(src) {
  $("edit-result").hidden = src === null;
  $("edit-result-note").hidden = src !== null;
  if (src !== null) $("edit-result").src = src;
}

// A point of the pointer event in the image's pixels (the canvas is shown scaled).
function imagePoint(event) {
  const canvas = $("edit-mask");
  const r = canvas.getBoundingClientRect();
  return [((event.clientX - r.left) * canvas.width) / r.width, ((event.clientY - r.top) * canvas.height) / r.height];
}

// A dot at `to`, or a line to it from `from`, painted or erased with the brush.
function stroke(from, to) {
  const ctx = maskContext();
  ctx.globalCompositeOperation = $("brush-erase").checked ? "destination-out" : "source-over";
  ctx.strokeStyle = ctx.fillStyle = maskColor;
  ctx.lineWidth = Number($("brush-size").value);
  ctx.lineCap = ctx.lineJoin = "round";
  ctx.beginPath();
  if (from) {
    ctx.moveTo(...from);
    ctx.lineTo(...to);
    ctx.stroke();
  } else {
    ctx.arc(...to, ctx.lineWidth / 2, 0, 2 * Math.PI);
    ctx.fill();
  }
}

// Mouse, pen and touch alike (pointer events); the pointer is captured so that a stroke may leave the canvas.
function watchPainting() {
  const canvas = $("edit-mask");
  let last = null;
  canvas.addEventListener("pointerdown", (e) => {
    if (page.edit === null || $("mask-tools").hidden) return;
    canvas.setPointerCapture(e.pointerId);
    last = imagePoint(e);
    stroke(null, last);
  });
  canvas.addEventListener("pointermove", (e) => {
    if (last === null) return;
    const point = imagePoint(e);
    stroke(last, point);
    last = point;
  });
  const end = () => {
    if (last === null) return;
    last = null;
    maskChanged();
  };
  canvas.addEventListener("pointerup", end);
  canvas.addEventListener("pointercancel", end);
}

// A mask painted or not picks the class that runs, so the rows follow it.
function maskChanged() {
  const painted = maskPixels() !== null;
  if (painted === page.edit.painted) return;
  page.edit.painted = painted;
  showModelFields();
}

// The mask as the server reads it: white where painted (the strokes' antialiased edges cut at half), black
// elsewhere, opaque; null when nothing is painted.
function maskPixels() {
  const { width, height } = $("edit-mask");
  const strokes = maskContext().getImageData(0, 0, width, height);
  const mask = new ImageData(width, height);
  let painted = false;
  for (let i = 0; i < strokes.data.length; i += 4) {
    const v = strokes.data[i + 3] >= 128 ? 255 : 0;
    painted ||= v === 255;
    mask.data.fill(v, i, i + 3);
    mask.data[i + 3] = 255;
  }
  return painted ? mask : null;
}

function maskPng() {
  const pixels = maskPixels();
  if (pixels === null) return null;
  const canvas = document.createElement("canvas");
  canvas.width = pixels.width;
  canvas.height = pixels.height;
  canvas.getContext("2d").putImageData(pixels, 0, 0);
  return canvas.toDataURL("image/png");
}

// ---- LoRA

// A row per adapter of the server's --lora-dir (a tick and a scale), for a model whose family takes LoRA; what
// was ticked survives a change of model.
function showLoras() {
  const model = selectedModel();
  const shown = page.loras.length > 0 && model !== undefined && model.kiln.takes_lora;
  const chosen = formLoras();
  const rows = page.loras.map((name) => {
    const row = document.createElement("label");
    row.className = "check lora";
    const tick = document.createElement("input");
    tick.type = "checkbox";
    tick.id = `lora-${name}`;
    const scale = document.createElement("input");
    scale.type = "number";
    scale.step = "any";
    scale.inputMode = "decimal";
    scale.placeholder = "1";
    scale.id = `lora-scale-${name}`;
    scale.title = `${name}'s scale`;
    const previous = chosen.find((l) => l.name === name);
    if (previous) {
      tick.checked = true;
      if (previous.scale !== 1) scale.value = previous.scale;
    }
    row.append(tick, ` ${name} `, scale);
    return row;
  });
  const legend = document.createElement("legend");
  legend.textContent = "LoRA";
  $("loras").replaceChildren(legend, ...rows);
  $("loras").hidden = !shown;
}

// The ticked adapters as the request's "loras".
function formLoras() {
  const loras = [];
  for (const tick of document.querySelectorAll("#loras input[type=checkbox]")) {
    if (!tick.checked) continue;
    const name = tick.id.slice(5);
    const scale = $(`lora-scale-${name}`).value;
    loras.push({ name, scale: scale === "" ? 1 : Number(scale) });
  }
  return loras;
}

// The generated rows' raw values, by JSON field.
function formFieldValues() {
  const values = {};
  for (const input of $("fields").querySelectorAll("[id^=field-]")) {
    if (input.value !== "") values[input.id.slice(6)] = input.value;
  }
  return values;
}

// A row's value as its field's JSON.
function fieldValue(field, text) {
  if (field.kind === "integer" || field.kind === "number") return Number(text);
  if (field.kind === "boolean") return text === "true";
  if (field.kind === "integer list") return text.split(",").map((v) => Number(v.trim()));
  return text;
}

async function loadModels() {
  const { data, kiln } = await (await api("/v1/models")).json();
  page.models = data;
  page.loras = (kiln && kiln.loras) || [];
  $("model").replaceChildren(
    ...data.map((m) => new Option(`${m.id} (${m.kiln.pipeline})`, m.id)),
  );
  showModelFields();
  $("server-status").textContent = `${data.length} model${data.length === 1 ? "" : "s"}`;
}

// ---- the form

function formParams() {
  const params = { model: $("model").value, prompt: $("prompt").value };
  const number = (id) => ($(id).value === "" ? undefined : Number($(id).value));
  const width = number("width");
  const height = number("height");
  if (width !== undefined || height !== undefined) {
    params.size = `${width ?? $("width").placeholder}x${height ?? $("height").placeholder}`;
  }
  const values = formFieldValues();
  for (const field of modelFields()) {
    if (values[field.json] !== undefined) params[field.json] = fieldValue(field, values[field.json]);
  }
  if (!$("random-seed").checked && number("seed") !== undefined) params.seed = number("seed");
  if (!$("loras").hidden) {
    const loras = formLoras();
    if (loras.length > 0) params.loras = loras;
  }
  if (page.edit !== null) {
    params.image = $("edit-image").toDataURL("image/png");  // a data URL, which the server takes
    if (masking()) params.mask_image = maskPng();  // no mask: image-to-image
  }
  return params;
}

function fillForm(params) {
  if (page.models.some((m) => m.id === params.model)) $("model").value = params.model;
  $("fields").replaceChildren();
  showModelFields();
  $("prompt").value = params.prompt ?? "";
  const [w, h] = (params.size || "x").split("x");
  $("width").value = w;
  $("height").value = h;
  for (const field of modelFields()) {
    const value = params[field.json];
    $(`field-${field.json}`).value = value === undefined ? "" : Array.isArray(value) ? value.join(",") : value;
  }
  for (const tick of document.querySelectorAll("#loras input[type=checkbox]")) {
    const name = tick.id.slice(5);
    const chosen = (params.loras || []).find((l) => l.name === name);
    tick.checked = chosen !== undefined;
    $(`lora-scale-${name}`).value = chosen && chosen.scale !== 1 ? chosen.scale : "";
  }
  $("random-seed").checked = false;
  $("seed").disabled = false;
  $("seed").value = params.seed;
  window.scrollTo({ top: 0, behavior: "smooth" });
}

// "Steps 8 · Guidance 0": the card's parameters by their fields' labels.
function describe(params) {
  const model = page.models.find((m) => m.id === params.model);
  const edits = (model && model.kiln.edits) || {};
  // An edit's fields too (strength, ...): the job's parameters leave out its images.
  const fields = [...((model && model.kiln.fields) || []), ...(edits.image_fields || []), ...(edits.mask_fields || [])]
    .filter((f, i, all) => all.findIndex((g) => g.json === f.json) === i);
  const parts = [params.model, params.size];
  for (const field of fields) {
    if (!ownRows.has(field.json) && params[field.json] !== undefined && field.kind !== "text")
      parts.push(`${field.label} ${params[field.json]}`);
  }
  for (const lora of params.loras || []) parts.push(`LoRA ${lora.name} ${lora.scale}`);
  parts.push(`seed ${params.seed}`);
  return parts.filter(Boolean).join(" · ");
}

// ---- a job and its events

// Calls onEvent(name, data) for each server-sent event until the stream ends.
async function readEvents(res, onEvent) {
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let name = "message";
      let data = "";
      for (const line of block.split("\n")) {
        if (line.startsWith("event: ")) name = line.slice(7);
        else if (line.startsWith("data: ")) data += line.slice(6);
      }
      if (data) onEvent(name, JSON.parse(data));
    }
  }
}

// edited: whether the job edits the loaded image, whose result then shows beside it.
async function follow(job, edited) {
  page.stream = new AbortController();
  const res = await api(`/v1/jobs/${job.id}/events`, { signal: page.stream.signal });
  let ended = false;
  await readEvents(res, (name, data) => {
    if (name === "queued") setStatus(data.position === 0 ? "queued, next" : `queued, ${data.position} ahead`, 0, 1);
    else if (name === "running") setStatus("starting…", 0, 1);
    else if (name === "step") setStatus(`step ${data.step} of ${data.steps}`, data.step, data.steps);
    else if (name === "done") {
      ended = true;
      setStatus(`done in ${data.seconds.toFixed(1)} s`, 1, 1);
      addToGallery(job.id, data.images)
        .then((srcs) => edited && page.edit !== null && showResult(srcs[0]))
        .catch((e) => showError(e.message));
    } else if (name === "failed" || name === "cancelled") {
      ended = true;
      setStatus(name, 0, 1);
      if (name === "failed") showError(data.error.message);
    }
  });
  if (!ended) throw new Error("the connection to the server was lost");
}

async function generate(event) {
  event.preventDefault();
  showError("");
  setBusy(true);
  setStatus("submitting…", 0, 1);
  try {
    const params = formParams();
    const job = await (await api("/v1/generate", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(params),
    })).json();
    page.job = job.id;
    await follow(job, params.image !== undefined);
  } catch (e) {
    if (e.name !== "AbortError") {
      showError(e.message);
      setStatus("", 0, 1);
    }
  } finally {
    page.job = null;
    page.stream = null;
    setBusy(false);
  }
}

async function cancel() {
  if (!page.job) return;
  $("cancel").disabled = true;
  try {
    await api(`/v1/jobs/${page.job}`, { method: "DELETE" });
  } catch (e) {
    showError(e.message);
  }
}

// ---- the gallery

// The images' object URLs, in order.
async function addToGallery(id, urls) {
  const { params } = await (await api(`/v1/jobs/${id}`)).json();
  const srcs = [];
  for (const url of urls) {
    // Fetched with the key, shown from memory: the server forgets old jobs, the page keeps what it made.
    const blob = await (await api(url)).blob();
    const card = $("card-template").content.firstElementChild.cloneNode(true);
    const img = card.querySelector("img");
    img.src = URL.createObjectURL(blob);
    srcs.push(img.src);
    img.alt = params.prompt;
    const caption = card.querySelector("figcaption");
    const b = document.createElement("b");
    b.textContent = params.prompt;
    caption.append(b, document.createElement("br"), describe(params));
    card.dataset.params = JSON.stringify(params);
    const reuse = () => fillForm(params);
    card.addEventListener("click", reuse);
    card.addEventListener("keydown", (e) => e.key === "Enter" && reuse());
    $("gallery").prepend(card);
  }
  return srcs;
}

// ---- start

async function start() {
  $("api-key").value = localStorage.getItem("kiln-api-key") || "";
  $("api-key").addEventListener("change", () => {
    localStorage.setItem("kiln-api-key", $("api-key").value.trim());
    loadModels().then(() => showError(""), (e) => showError(e.message));
  });
  $("model").addEventListener("change", showModelFields);
  $("random-seed").addEventListener("change", () => {
    $("seed").disabled = $("random-seed").checked;
  });
  $("generate-form").addEventListener("submit", generate);
  $("cancel").addEventListener("click", cancel);
  $("edit-file").addEventListener("change", () => {
    const file = $("edit-file").files[0];
    if (file) loadImage(file).then(() => showError(""), (e) => showError(e.message));
  });
  $("edit-remove").addEventListener("click", removeImage);
  $("mask-clear").addEventListener("click", () => {
    const { width, height } = $("edit-mask");
    maskContext().clearRect(0, 0, width, height);
    maskChanged();
  });
  watchPainting();
  // A job nobody will see is cancelled when the page goes (keepalive lets the request outlive it).
  window.addEventListener("pagehide", () => {
    if (page.job) fetch(`/v1/jobs/${page.job}`, { method: "DELETE", headers: authHeaders(), keepalive: true });
  });
  try {
    const health = await (await fetch("/health")).json();
    $("api-key-row").hidden = !health.api_key_required;
    await loadModels();
  } catch (e) {
    $("server-status").textContent = "not connected";
    showError(e.message);
  }
}

start();
