// flux-lite's page: a form over the server's own API (docs/serve.md).
// Text to image goes to /v1/images/generations (with reference images);
// image to image and inpainting to /sdapi/v1/img2img. While a job runs the
// page polls /v1/jobs/ID for its place and step and /v1/jobs/ID/preview for
// the image forming; the gallery is /v1/gallery.
'use strict';

const $ = (id) => document.getElementById(id);
const KEY_STORE = 'flux-lite-api-key';
const POLL_MS = 400;

const state = {
  config: null,
  key: localStorage.getItem(KEY_STORE) || '',
  references: [], // {name, dataUrl}
  init: null, // {name, dataUrl, width, height, image}
  maskPainted: false,
  job: null, // the running job's id
  galleryUrls: new Map(), // gallery id -> blob URL
};

// ---- talking to the server ------------------------------------------------

let keyWaiters = null;

/** Asks for the API key once; every request waiting on it resumes with it. */
function askKey(wrong) {
  if (!keyWaiters) {
    keyWaiters = [];
    $('err-key').textContent = wrong ? 'That key was refused; try again.' : '';
    $('key-dialog').showModal();
    $('api-key').focus();
  }
  return new Promise((resolve) => keyWaiters.push(resolve));
}

function keyGiven(event) {
  event.preventDefault();
  state.key = $('api-key').value;
  localStorage.setItem(KEY_STORE, state.key);
  $('key-dialog').close();
  const waiters = keyWaiters || [];
  keyWaiters = null;
  waiters.forEach((resolve) => resolve());
}

async function call(method, path, body, jobId) {
  for (let asked = 0; ; asked++) {
    const headers = {};
    if (state.key) headers.Authorization = 'Bearer ' + state.key;
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    if (jobId) headers['X-Job-Id'] = jobId;
    const response = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
    if (response.status !== 401) return response;
    await askKey(asked > 0 || Boolean(state.key));
  }
}

async function errorOf(response) {
  try {
    const body = await response.json();
    return (body.error && body.error.message) || response.statusText;
  } catch (_) {
    return `${response.status} ${response.statusText}`;
  }
}

// ---- the form --------------------------------------------------------------

const number = (id) => {
  const v = $(id).value.trim();
  return v === '' ? undefined : Number(v);
};

function applyConfig(config) {
  state.config = config;
  const d = config.defaults;
  $('model-line').textContent = `${config.model} · ${config.tier} on ${config.adapter}` + (config.distilled ? ' · guidance-distilled' : '');
  for (const [id, value] of [['width', d.width], ['height', d.height], ['steps', d.steps], ['guidance', d.guidance], ['strength', d.strength]]) {
    if ($(id).value === '') $(id).value = value;
  }
  $('negative-field').hidden = config.distilled;
  $('count').max = config.limits.max_images;
  $('steps').max = config.limits.max_steps;
}

function clearErrors() {
  document.querySelectorAll('.error').forEach((e) => { e.textContent = ''; });
  document.querySelectorAll('.invalid').forEach((e) => e.classList.remove('invalid'));
}

// The settings a refusal names, by the API's field names, and where the page shows them.
const FIELDS = [
  ['negative_prompt', 'negative'], ['prompt', 'prompt'], ['width', 'width'], ['height', 'height'],
  ['steps', 'steps'], ['guidance', 'guidance'], ['cfg_scale', 'guidance'], ['seed', 'seed'],
  ['batch_size', 'count'], ['n', 'count'], ['init_images[0]', 'init'], ['init_images', 'references'],
  ['images', 'references'], ['image', 'references'], ['mask', 'mask'], ['denoising_strength', 'strength'],
  ['strength', 'strength'],
];

/** Which field a refusal is about: the message starts with its name. */
function fieldOf(message) {
  if (/^size \S+: width/.test(message)) return 'width';
  if (/^size \S+: height/.test(message)) return 'height';
  if (message.startsWith('size ')) return 'width';
  for (const [name, field] of FIELDS) {
    if (message.startsWith(name) && /^[ :[×]/.test(message.slice(name.length) || ' ')) return field;
  }
  return 'general';
}

function showError(message) {
  const field = fieldOf(message);
  const slot = $('err-' + field) || $('err-general');
  slot.textContent = message;
  const input = $(field);
  if (input && input.classList) {
    input.classList.add('invalid');
    input.focus();
  }
  if (['init', 'mask', 'strength'].includes(field)) $('init-box').open = true;
  if (field === 'references') $('references-box').open = true;
}

function request() {
  const seed = $('random-seed').checked ? undefined : number('seed');
  const common = {
    prompt: $('prompt').value,
    negative_prompt: state.config && state.config.distilled ? undefined : $('negative').value,
    steps: number('steps'),
  };
  const references = state.references.map((r) => r.dataUrl);
  if (state.init) {
    const body = {
      ...common,
      cfg_scale: number('guidance'),
      seed: seed === undefined ? -1 : seed,
      batch_size: number('count'),
      init_images: [state.init.dataUrl, ...references],
      denoising_strength: number('strength'),
    };
    if (state.maskPainted) body.mask = maskPng();
    return ['/sdapi/v1/img2img', body];
  }
  const body = { ...common, guidance: number('guidance'), seed, n: number('count'), images: references };
  const [w, h] = [number('width'), number('height')];
  if (w !== undefined || h !== undefined) body.size = `${w ?? ''}x${h ?? ''}`;
  return ['/v1/images/generations', body];
}

/** The images an answer carries, as data URLs with their seeds. */
function imagesOf(answer) {
  if (answer.data) {
    const type = answer.output_format === 'jpeg' ? 'image/jpeg' : answer.output_format === 'webp' ? 'image/webp' : 'image/png';
    return answer.data.map((d) => ({ src: `data:${type};base64,${d.b64_json}`, seed: d.seed }));
  }
  const seeds = JSON.parse(answer.info).all_seeds;
  return answer.images.map((b64, i) => ({ src: `data:image/png;base64,${b64}`, seed: seeds[i] }));
}

async function generate(event) {
  event.preventDefault();
  if (state.job) return;
  clearErrors();
  const id = 'page-' + Date.now().toString(36) + '-' + Math.random().toString(36).slice(2, 8);
  const [path, body] = request();
  running(id);
  const poller = poll(id);
  let response;
  try {
    response = await call('POST', path, body, id);
  } catch (e) {
    finished(`failed: ${e.message}`);
    $('err-general').textContent = `The server cannot be reached (${e.message}).`;
    return;
  } finally {
    poller.stop();
  }
  if (!response.ok) {
    const message = await errorOf(response);
    if (response.status === 409 && message.includes('cancelled')) {
      finished('cancelled');
      return;
    }
    finished('refused');
    showError(message);
    return;
  }
  const images = imagesOf(await response.json());
  const results = $('results');
  results.replaceChildren(...images.map((image) => {
    const figure = document.createElement('figure');
    const img = document.createElement('img');
    img.src = image.src;
    img.alt = `the image of seed ${image.seed}`;
    img.dataset.seed = image.seed;
    const caption = document.createElement('figcaption');
    caption.textContent = `seed ${image.seed}`;
    figure.append(img, caption);
    return figure;
  }));
  if ($('random-seed').checked && images.length) $('seed').value = images[0].seed;
  $('preview-box').hidden = true;
  finished('done');
  refreshGallery();
}

function running(id) {
  state.job = id;
  $('generate').disabled = true;
  $('cancel').disabled = false;
  $('status').textContent = 'sent';
  $('results').replaceChildren();
  $('preview-box').hidden = true;
}

function finished(status) {
  state.job = null;
  $('generate').disabled = false;
  $('cancel').disabled = true;
  $('status').textContent = status;
  $('status').dataset.state = status;
}

/** Polls the job's place, step and preview until stopped. */
function poll(id) {
  let stopped = false;
  let previewUrl = null;
  const tick = async () => {
    if (stopped) return;
    try {
      const r = await call('GET', `/v1/jobs/${encodeURIComponent(id)}`);
      if (r.ok && !stopped) {
        const job = await r.json();
        if (job.status === 'queued') {
          $('status').textContent = job.queue_position === 0 ? 'queued: next' : `queued: ${job.queue_position} ahead`;
        } else if (job.status === 'running') {
          const image = job.n > 1 ? ` of image ${job.image + 1} of ${job.n}` : '';
          $('status').textContent = `step ${Math.min(job.step + 1, job.steps)} of ${job.steps}${image}`;
          if (state.config && state.config.previews) {
            const p = await call('GET', `/v1/jobs/${encodeURIComponent(id)}/preview`);
            if (p.ok && !stopped) {
              const url = URL.createObjectURL(await p.blob());
              $('preview').src = url;
              $('preview-box').hidden = false;
              if (previewUrl) URL.revokeObjectURL(previewUrl);
              previewUrl = url;
            }
          }
        }
      }
    } catch (_) {
      // The next tick tries again; the POST's answer says what happened.
    }
    if (!stopped) setTimeout(tick, POLL_MS);
  };
  setTimeout(tick, POLL_MS);
  return { stop: () => { stopped = true; } };
}

async function cancel() {
  if (!state.job) return;
  $('status').textContent = 'cancelling…';
  await call('DELETE', `/v1/jobs/${encodeURIComponent(state.job)}`);
}

// ---- input images ------------------------------------------------------------

function readFile(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

async function addReferences(files) {
  for (const file of files) {
    if (!file.type.startsWith('image/')) continue;
    state.references.push({ name: file.name, dataUrl: await readFile(file) });
  }
  drawReferences();
}

function drawReferences() {
  $('reference-count').textContent = state.references.length ? `(${state.references.length})` : '';
  $('references').replaceChildren(...state.references.map((r, i) => {
    const li = document.createElement('li');
    const img = document.createElement('img');
    img.src = r.dataUrl;
    img.alt = r.name;
    const remove = document.createElement('button');
    remove.type = 'button';
    remove.textContent = '×';
    remove.setAttribute('aria-label', `remove ${r.name}`);
    remove.onclick = () => { state.references.splice(i, 1); drawReferences(); };
    li.append(img, remove);
    return li;
  }));
}

async function setInit(file) {
  if (!file || !file.type.startsWith('image/')) return;
  const dataUrl = await readFile(file);
  const image = new Image();
  image.onload = () => {
    state.init = { name: file.name, dataUrl, width: image.naturalWidth, height: image.naturalHeight, image };
    for (const id of ['init-canvas', 'mask-canvas']) {
      $(id).width = image.naturalWidth;
      $(id).height = image.naturalHeight;
    }
    $('init-canvas').getContext('2d').drawImage(image, 0, 0);
    clearMask();
    $('mask-tools').hidden = false;
    sizeFromInit(true);
  };
  image.src = dataUrl;
}

function removeInit() {
  state.init = null;
  state.maskPainted = false;
  $('mask-tools').hidden = true;
  $('init-file').value = '';
  sizeFromInit(false);
}

/** With a picture to change, it sets the size (as the pipeline takes it). */
function sizeFromInit(taken) {
  for (const id of ['width', 'height']) {
    $(id).disabled = taken;
    $(id).title = taken ? 'the picture to change sets the size' : '';
  }
  if (taken) {
    $('width').value = state.init.width;
    $('height').value = state.init.height;
  }
}

// The mask: white strokes on a transparent canvas over the picture; sent as
// white on black (white repaints), the picture's own size.
function clearMask() {
  const canvas = $('mask-canvas');
  canvas.getContext('2d').clearRect(0, 0, canvas.width, canvas.height);
  state.maskPainted = false;
  $('mask-download').href = '#';
}

function maskPng() {
  const mask = $('mask-canvas');
  const out = document.createElement('canvas');
  out.width = mask.width;
  out.height = mask.height;
  const ctx = out.getContext('2d');
  ctx.fillStyle = '#000';
  ctx.fillRect(0, 0, out.width, out.height);
  ctx.drawImage(mask, 0, 0);
  return out.toDataURL('image/png');
}

function setUpBrush() {
  const canvas = $('mask-canvas');
  let last = null;
  const at = (event) => {
    const rect = canvas.getBoundingClientRect();
    return [(event.clientX - rect.left) * canvas.width / rect.width, (event.clientY - rect.top) * canvas.height / rect.height];
  };
  const stroke = (from, to) => {
    const ctx = canvas.getContext('2d');
    const erase = document.querySelector('input[name=brush]:checked').value === 'erase';
    ctx.globalCompositeOperation = erase ? 'destination-out' : 'source-over';
    ctx.strokeStyle = '#fff';
    ctx.fillStyle = '#fff';
    ctx.lineCap = 'round';
    ctx.lineJoin = 'round';
    const scale = canvas.width / canvas.getBoundingClientRect().width;
    ctx.lineWidth = Number($('brush-size').value) * scale;
    ctx.beginPath();
    ctx.moveTo(from[0], from[1]);
    ctx.lineTo(to[0], to[1]);
    ctx.stroke();
    if (!erase) state.maskPainted = true;
  };
  canvas.addEventListener('pointerdown', (event) => {
    canvas.setPointerCapture(event.pointerId);
    last = at(event);
    stroke(last, last);
  });
  canvas.addEventListener('pointermove', (event) => {
    if (!last) return;
    const point = at(event);
    stroke(last, point);
    last = point;
  });
  const end = () => {
    if (!last) return;
    last = null;
    $('mask-download').href = maskPng();
  };
  canvas.addEventListener('pointerup', end);
  canvas.addEventListener('pointercancel', end);
}

/** A drop zone over a file input: drop, click, or Enter/Space from the keyboard. */
function dropZone(zone, input, take) {
  zone.addEventListener('dragover', (e) => { e.preventDefault(); zone.classList.add('over'); });
  zone.addEventListener('dragleave', () => zone.classList.remove('over'));
  zone.addEventListener('drop', (e) => {
    e.preventDefault();
    zone.classList.remove('over');
    take([...e.dataTransfer.files]);
  });
  zone.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); input.click(); }
  });
  input.addEventListener('change', () => take([...input.files]));
}

// ---- the gallery -------------------------------------------------------------

async function refreshGallery() {
  let list;
  try {
    const r = await call('GET', '/v1/gallery');
    if (!r.ok) return;
    list = (await r.json()).images;
  } catch (_) {
    return;
  }
  const items = [];
  for (const shot of list) {
    let url = state.galleryUrls.get(shot.id);
    if (!url) {
      const r = await call('GET', shot.url);
      if (!r.ok) continue;
      url = URL.createObjectURL(await r.blob());
      state.galleryUrls.set(shot.id, url);
    }
    items.push(galleryItem(shot, url));
  }
  $('gallery').replaceChildren(...items);
}

function galleryItem(shot, url) {
  const s = shot.settings || {};
  const li = document.createElement('li');
  const img = document.createElement('img');
  img.src = url;
  img.alt = s.prompt || 'an image';
  const prompt = document.createElement('p');
  prompt.textContent = s.prompt || '';
  const settings = document.createElement('p');
  settings.className = 'settings';
  settings.textContent = `${s.width}×${s.height}, ${s.steps} steps, guidance ${s.guidance}, seed ${shot.seed}` + (s.negative_prompt ? `; not: ${s.negative_prompt}` : '');
  const buttons = document.createElement('div');
  buttons.className = 'buttons';
  const download = document.createElement('a');
  download.href = url;
  download.download = `flux-lite-${shot.job}-${shot.seed}.${shot.format === 'jpeg' ? 'jpg' : shot.format}`;
  download.textContent = 'Download';
  const again = document.createElement('button');
  again.type = 'button';
  again.textContent = 'Use these settings';
  again.onclick = () => useSettings(s, shot.seed);
  buttons.append(download, again);
  li.append(img, prompt, settings, buttons);
  return li;
}

function useSettings(s, seed) {
  $('prompt').value = s.prompt || '';
  $('negative').value = s.negative_prompt || '';
  for (const id of ['width', 'height', 'steps', 'guidance']) {
    if (s[id] !== undefined) $(id).value = s[id];
  }
  $('random-seed').checked = false;
  $('seed').disabled = false;
  $('seed').value = seed;
  $('prompt').focus();
  window.scrollTo({ top: 0 });
}

// ---- start -------------------------------------------------------------------

async function start() {
  $('key-form').addEventListener('submit', keyGiven);
  $('job-form').addEventListener('submit', generate);
  $('cancel').addEventListener('click', cancel);
  $('random-seed').addEventListener('change', () => { $('seed').disabled = $('random-seed').checked; });
  $('refresh-gallery').addEventListener('click', refreshGallery);
  $('clear-mask').addEventListener('click', clearMask);
  $('remove-init').addEventListener('click', removeInit);
  dropZone($('reference-drop'), $('reference-files'), addReferences);
  dropZone($('init-drop'), $('init-file'), (files) => setInit(files[0]));
  setUpBrush();
  try {
    const r = await call('GET', '/v1/config');
    if (!r.ok) throw new Error(await errorOf(r));
    applyConfig(await r.json());
    document.body.dataset.ready = 'yes';
  } catch (e) {
    $('model-line').textContent = `the server cannot be reached (${e.message})`;
  }
  refreshGallery();
}

document.addEventListener('DOMContentLoaded', start);
