//! `flux-lite serve`: one model loaded once, answering the OpenAI Images API
//! and AUTOMATIC1111's API over HTTP. axum on tokio parses, checks and waits;
//! one worker thread owns the GPU and takes jobs from a bounded queue, so a
//! burst beyond the queue is refused at once (503) instead of piling up.

mod api;
mod gallery;
mod guard;
mod jobs;
mod metrics;
mod page;
mod stream;

use api::{A1111Request, ApiError, Limits, OpenAiRequest};
use flux_lite_platform::pipeline::KvPrecision;
use argh::FromArgs;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path as UrlPath, Request as HttpRequest, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine;
use jobs::{Jobs, Outcome, Picture, Worker};
use flux_lite_platform::pipeline::{self, Pipeline};
use flux_lite_platform::GpuOptions;
use serde_json::json;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// The environment variable that may hold the API key instead of `--api-key`.
pub const API_KEY_VARIABLE: &str = "FLUX_LITE_API_KEY";

/// Serve a model over HTTP: the OpenAI Images API and AUTOMATIC1111's API.
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "serve")]
pub struct ServeArgs {
    /// the diffusers model folder, loaded once
    #[argh(option)]
    model: PathBuf,
    /// read the transformer from this folder instead of the model's transformer/, or from a GGUF file (BFL's tensor names, as ComfyUI-GGUF and stable-diffusion.cpp write them)
    #[argh(option)]
    transformer: Option<PathBuf>,
    /// read the text encoder from a GGUF file (llama.cpp's Qwen3 layout, e.g. Qwen3-4B-Q8_0.gguf) instead of the model's text_encoder/
    #[argh(option)]
    text_encoder: Option<PathBuf>,
    /// a LoRA adapter added to every request, FILE[:SCALE] as for gen; repeat to add several
    #[argh(option, from_str_fn(crate::lora::parse_lora))]
    lora: Vec<flux_lite_platform::model::lora::LoraSpec>,
    /// the address to listen on (default 127.0.0.1: this machine only)
    #[argh(option, default = "IpAddr::from([127, 0, 0, 1])")]
    host: IpAddr,
    /// the port (default 7860; 0: any free port, printed at start)
    #[argh(option, default = "7860")]
    port: u16,
    /// memory the server may use for one request, device and host together, e.g. 4GiB (default: the adapter's memory less 10% where it is known, else no limit); components stay loaded between requests while they fit beside it
    #[argh(option, from_str_fn(crate::budget::parse_memory_budget))]
    memory_budget: Option<u64>,
    /// the transformer's keys and values under --memory-budget, for every request: auto (default: f32, or f16 where only that fits), f32 (the exact path) or f16
    #[argh(option, default = "KvPrecision::Auto", from_str_fn(crate::gen::parse_kv_precision))]
    kv_precision: KvPrecision,
    /// precision tier, as for gen (default auto)
    #[argh(option, default = "flux_lite_platform::Precision::Auto", from_str_fn(crate::tier::parse_precision))]
    precision: flux_lite_platform::Precision,
    /// requests must carry `Authorization: Bearer KEY` (default: the FLUX_LITE_API_KEY variable; none: no key)
    #[argh(option)]
    api_key: Option<String>,
    /// jobs that may wait behind the running one; more are refused with 503 (default 8)
    #[argh(option, default = "8")]
    queue: usize,
    /// images one request may ask for (default 8)
    #[argh(option, default = "8")]
    max_images: usize,
    /// denoising steps one request may ask for (default 100)
    #[argh(option, default = "100")]
    max_steps: usize,
    /// the largest image side a request may ask for, in pixels (default 4096)
    #[argh(option, default = "4096")]
    max_side: usize,
    /// the largest request body, in MiB (default 64: room for reference images in base64)
    #[argh(option, default = "64")]
    max_body_mib: usize,
    /// draw the previews of running jobs (AUTOMATIC1111's `current_image`, OpenAI's `partial_images`) with this tiny decoder (diffusers' AutoencoderTiny layout or TAESD's, e.g. TAEF2) instead of the VAE's latent-to-RGB map
    #[argh(option)]
    preview_decoder: Option<PathBuf>,
    /// a web origin (scheme://host:port) whose pages may use this server besides its own, e.g. http://localhost:3000; repeat for several, * for any (default: none: browsers' requests from other sites are refused)
    #[argh(option)]
    allow_origin: Vec<String>,
    /// a host name the server answers to besides localhost and its address (behind a proxy or under a local name); repeat for several. Others are refused, against DNS rebinding
    #[argh(option)]
    allow_host: Vec<String>,
    /// the images the page's gallery keeps in memory, newest first (default 32; 0: none)
    #[argh(option, default = "32")]
    gallery: usize,
    /// answer GET /metrics without the API key, as /health (default: with a key, /metrics asks for it)
    #[argh(switch)]
    metrics_public: bool,
    /// log what each job reused from the one before
    #[argh(switch)]
    verbose: bool,
}

/// What every handler shares.
#[derive(Debug)]
struct App {
    pipeline: Arc<Pipeline>,
    jobs: Arc<Jobs>,
    limits: Limits,
    /// The model's name as `/v1/models` and the A1111 endpoints give it.
    model_name: String,
    /// What every image this server makes carries of the model and device.
    recipe: crate::recipe::Run,
    api_key: Option<String>,
    metrics_public: bool,
    /// Whether running jobs draw previews.
    previews: bool,
}

pub fn run(args: &ServeArgs) -> Result<(), String> {
    if args.queue == 0 || args.max_images == 0 || args.max_steps == 0 || args.max_side == 0 || args.max_body_mib == 0 {
        return Err("--queue, --max-images, --max-steps, --max-side and --max-body-mib must be at least 1".into());
    }
    let api_key = args.api_key.clone().or_else(|| std::env::var(API_KEY_VARIABLE).ok()).filter(|k| !k.is_empty());
    if !is_loopback(args.host) && api_key.is_none() {
        eprintln!("warning: listening on {} without an API key: anyone who can reach it can use the GPU (give --api-key or {API_KEY_VARIABLE})", args.host);
    }
    let mut model = pipeline::open_model(&args.model, args.transformer.as_deref(), args.text_encoder.as_deref()).map_err(|e| e.to_string())?;
    if let Some(file) = &args.preview_decoder {
        model = model.with_preview_decoder(file).map_err(|e| format!("--preview-decoder: {e}"))?;
    }
    let lora = crate::lora::open_lora(&args.lora, &model.transformer, args.verbose)?;
    let interrupt = Arc::new(AtomicBool::new(false));
    let gpu = GpuOptions { interrupt: Some(interrupt.clone()), precision: args.precision, ..crate::env_gpu_options()? };
    let pipeline = Arc::new(Pipeline::with_model(model, &gpu).map_err(|e| e.to_string())?.keep_loaded(true).scratch_dir(crate::scratch_dir()));
    eprintln!("adapter: {}", pipeline.gpu().describe());
    let (jobs, queue) = Jobs::new(args.queue, args.gallery, interrupt);
    let model_name = args.model.display().to_string();
    // Previews with a tiny decoder, or where the VAE has a latent-to-RGB map: AUTOMATIC1111's progress shows them.
    let previews = pipeline.model().preview_decoder.is_some() || pipeline::preview::latent_rgb(pipeline.model()).is_ok();
    let worker = Worker { pipeline: pipeline.clone(), jobs: jobs.clone(), verbose: args.verbose, previews };
    let recipe = crate::recipe::Run::of_pipeline(&args.model, &pipeline, args.transformer.as_deref(), args.text_encoder.as_deref())?;
    let worker = std::thread::Builder::new().name("gpu".into()).spawn(move || worker.run(queue)).map_err(|e| format!("cannot start the GPU worker: {e}"))?;
    let job = flux_lite_platform::Limits { max_images: args.max_images, max_steps: args.max_steps, max_side: args.max_side, ..Default::default() };
    let limits = Limits { job, memory_budget: args.memory_budget, kv_precision: args.kv_precision, lora };
    let app = Arc::new(App { pipeline, jobs: jobs.clone(), limits, model_name, recipe, api_key, metrics_public: args.metrics_public, previews });
    let guard = Arc::new(guard::Guard { bound: args.host, hosts: args.allow_host.clone(), origins: args.allow_origin.clone() });
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().map_err(|e| format!("cannot start the HTTP runtime: {e}"))?;
    let served = runtime.block_on(async {
        let address = SocketAddr::new(args.host, args.port);
        let listener = tokio::net::TcpListener::bind(address).await.map_err(|e| format!("--host {} --port {}: cannot listen: {e}", args.host, args.port))?;
        let bound = listener.local_addr().map_err(|e| e.to_string())?;
        eprintln!("listening on http://{bound}");
        let router = router(app.clone(), args.max_body_mib << 20, guard);
        axum::serve(listener, router).with_graceful_shutdown(stop_signal(jobs.clone())).await.map_err(|e| format!("the server stopped: {e}"))
    });
    // The listener is closed and every request answered; the worker ends once the queue is drained.
    jobs.shut_down();
    let _ = worker.join();
    served?;
    eprintln!("stopped");
    Ok(())
}

fn router(app: Arc<App>, max_body: usize, guard: Arc<guard::Guard>) -> Router {
    Router::new()
        .route("/", get(page::index))
        .route("/page.js", get(page::script))
        .route("/page.css", get(page::style))
        .route("/v1/config", get(config))
        .route("/v1/gallery", get(list_gallery))
        .route("/v1/gallery/{id}", get(gallery_image))
        .route("/v1/jobs/{id}/preview", get(job_preview))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/v1/images/generations", post(openai_generations))
        .route("/v1/images/edits", post(openai_generations))
        .route("/v1/jobs", get(list_jobs))
        .route("/v1/jobs/{id}", get(show_job).delete(cancel_job))
        .route("/sdapi/v1/txt2img", post(a1111_generate))
        .route("/sdapi/v1/img2img", post(a1111_generate))
        .route("/sdapi/v1/progress", get(a1111_progress))
        .route("/sdapi/v1/interrupt", post(a1111_interrupt))
        .route("/sdapi/v1/sd-models", get(a1111_models))
        .route("/sdapi/v1/png-info", post(a1111_png_info))
        .route("/sdapi/v1/options", get(a1111_options).post(a1111_set_options))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(app.clone(), authorize))
        .layer(axum::middleware::from_fn_with_state(guard, guard::check))
        .layer(axum::middleware::from_fn_with_state(max_body, refuse_declared_oversize))
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(app)
}

/// Ctrl-C or SIGTERM: no new requests; the running job stops at its next
/// block and the queued ones are answered 503.
async fn stop_signal(jobs: Arc<Jobs>) {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    eprintln!("stopping: no new requests; the running job is stopped, queued ones are answered 503");
    jobs.shut_down();
}

fn is_loopback(ip: IpAddr) -> bool {
    ip.is_loopback()
}

/// `GET /metrics`: Prometheus' text format.
async fn metrics(State(app): State<Arc<App>>) -> Response {
    let memory = app.pipeline.gpu().memory();
    let budget = app.limits.memory_budget.or_else(|| app.pipeline.gpu().memory_offered().map(|m| m.default_budget()));
    let device = metrics::Device {
        live: memory.live,
        high_water: memory.high_water,
        budget,
        adapter: app.recipe.adapter.clone(),
        tier: app.recipe.precision.clone(),
        model: app.recipe.model.name.clone(),
    };
    let text = app.jobs.metrics.render(app.jobs.counts(), &device);
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}

/// With an API key, every request but `/health` (and `/metrics` with
/// `--metrics-public`) carries it as a bearer token.
async fn authorize(State(app): State<Arc<App>>, request: HttpRequest, next: Next) -> Response {
    let Some(key) = &app.api_key else { return next.run(request).await };
    let path = request.uri().path();
    if path == "/health" || page::PATHS.contains(&path) || (path == "/metrics" && app.metrics_public) {
        return next.run(request).await;
    }
    let given = request.headers().get(axum::http::header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    match given {
        Some(g) if constant_time_eq(g.as_bytes(), key.as_bytes()) => next.run(request).await,
        _ => ApiError::new(StatusCode::UNAUTHORIZED, "missing or wrong API key (Authorization: Bearer KEY)").into_response(),
    }
}

/// A body whose declared length is over the limit is refused from the
/// header, before the client uploads it (a body without a declared length
/// is cut at the limit as it is read).
async fn refuse_declared_oversize(State(max_body): State<usize>, request: HttpRequest, next: Next) -> Response {
    let declared = request.headers().get(axum::http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    match declared {
        Some(n) if n > max_body as u64 => {
            ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, format!("the request body: {n} bytes is over this server's {} MiB (--max-body-mib)", max_body >> 20)).into_response()
        }
        _ => next.run(request).await,
    }
}

/// Compares without returning early, so the time taken does not tell how much of a key matched.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "no such endpoint (see docs/serve.md: /v1/images/generations, /sdapi/v1/txt2img, /health, …)")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "this endpoint does not take that method")
}

async fn health(State(app): State<Arc<App>>) -> Json<serde_json::Value> {
    Json(json!({
        "status": "ok",
        "model": app.model_name,
        "adapter": app.pipeline.gpu().describe(),
        "jobs_waiting": app.jobs.waiting(),
        "running": app.jobs.running().map(|j| j.id.clone()),
    }))
}

async fn models(State(app): State<Arc<App>>) -> Json<serde_json::Value> {
    Json(json!({ "object": "list", "data": [{ "id": app.model_name, "object": "model", "created": 0, "owned_by": "flux-lite" }] }))
}

/// A JSON body, or the one-line 4xx that says why not.
fn parse<T: serde::de::DeserializeOwned>(body: Result<Bytes, BytesRejection>) -> Result<T, ApiError> {
    let body = body.map_err(|e| ApiError::new(e.status(), format!("the request body: {}", one_line(&e.body_text()))))?;
    serde_json::from_slice(&body).map_err(|e| ApiError::bad(format!("the request body is not the JSON expected: {e}")))
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The client's `X-Job-Id`, if it gave one it can poll and cancel by.
fn job_id(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get("x-job-id") else { return Ok(None) };
    let id = value.to_str().map_err(|_| ApiError::bad("X-Job-Id: not text"))?;
    let ok = !id.is_empty() && id.len() <= 64 && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.');
    if !ok {
        return Err(ApiError::bad("X-Job-Id: 1 to 64 of A-Z a-z 0-9 - _ ."));
    }
    Ok(Some(id.to_string()))
}

/// Queues the order and waits for its images. If the client goes away
/// first, its job is cancelled (axum drops this future).
async fn run_order(app: &App, order: api::Order, id: Option<String>) -> Result<(String, Vec<Picture>), ApiError> {
    let (state, outcome) = app.jobs.submit(order, id)?;
    let guard = CancelOnDrop { jobs: app.jobs.clone(), state: Some(state.clone()) };
    let outcome: Outcome = outcome.await.unwrap_or_else(|_| Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the GPU worker stopped")));
    guard.disarm();
    outcome.map(|pictures| (state.id.clone(), pictures))
}

/// Cancels a job whose client is gone.
struct CancelOnDrop {
    jobs: Arc<Jobs>,
    state: Option<Arc<jobs::JobState>>,
}

impl CancelOnDrop {
    fn disarm(mut self) {
        self.state = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(state) = self.state.take() {
            if self.jobs.cancel(&state) {
                eprintln!("{}: the client went away; cancelled", state.id);
            }
        }
    }
}

fn with_job_header(mut response: Response, id: &str) -> Response {
    if let Ok(v) = HeaderValue::from_str(id) {
        response.headers_mut().insert("x-job-id", v);
    }
    response
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

async fn openai_generations(State(app): State<Arc<App>>, headers: HeaderMap, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let id = job_id(&headers)?;
    let request = parse::<OpenAiRequest>(body)?;
    let stream = api::streaming(request.stream, request.partial_images)?;
    let asked = request.asked(pipeline::job::DEFAULT_SIDE)?;
    let prompt = asked.prompt.clone();
    let order = checked(&app, asked, api::Shape::OpenAi).await?;
    let format = order.format.name();
    if let Some(partials) = stream {
        let size = format!("{}x{}", order.job.request().width, order.job.request().height);
        let (state, outcome) = app.jobs.submit(order, id)?;
        return Ok(stream::events(app.jobs.clone(), state, outcome, partials, size, format));
    }
    let (id, pictures) = run_order(&app, order, id).await?;
    let data: Vec<serde_json::Value> = pictures.iter().map(|p| json!({ "b64_json": b64(&p.bytes), "revised_prompt": prompt, "seed": p.seed })).collect();
    Ok(with_job_header(Json(json!({ "created": now(), "data": data, "output_format": format })).into_response(), &id))
}

async fn a1111_generate(State(app): State<Arc<App>>, headers: HeaderMap, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let id = job_id(&headers)?;
    let raw: serde_json::Value = parse(body)?;
    let request: A1111Request = serde_json::from_value(raw.clone()).map_err(|e| ApiError::bad(format!("the request body is not the JSON expected: {e}")))?;
    let asked = request.asked()?;
    let (prompt, negative) = (asked.prompt.clone(), asked.negative_prompt.clone());
    let order = checked(&app, asked, api::Shape::A1111).await?;
    let r = order.job.request();
    let (width, height, steps, guidance) = (r.width, r.height, r.steps, r.guidance);
    let recipe_of = {
        let (run, prompt, request) = (order.run.clone(), order.prompt().clone(), r.clone());
        move |seed: u64| run.recipe(&prompt, seed, &request)
    };
    let (id, pictures) = run_order(&app, order, id).await?;
    let seeds: Vec<u64> = pictures.iter().map(|p| p.seed).collect();
    // Each image's settings in A1111's wording, as its PNG's `parameters` holds them.
    let infotexts: Vec<String> = seeds.iter().map(|&seed| crate::recipe::a1111_parameters(&recipe_of(seed))).collect();
    let info = json!({
        "infotexts": infotexts,
        "prompt": prompt,
        "all_prompts": vec![&prompt; seeds.len()],
        "negative_prompt": negative,
        "all_negative_prompts": vec![&negative; seeds.len()],
        "seed": seeds.first(),
        "all_seeds": seeds,
        "width": width,
        "height": height,
        "steps": steps,
        "cfg_scale": guidance,
        "sd_model_name": app.model_name,
        "job": id,
    });
    let mut parameters = raw;
    if let Some(p) = parameters.as_object_mut() {
        // The echo leaves out the images sent: they can be megabytes.
        p.remove("init_images");
    }
    let body = json!({ "images": pictures.iter().map(|p| b64(&p.bytes)).collect::<Vec<_>>(), "parameters": parameters, "info": info.to_string() });
    Ok(with_job_header(Json(body).into_response(), &id))
}

/// Checks an order off the runtime's threads (decoding reference images and planning take a moment).
async fn checked(app: &Arc<App>, asked: api::Asked, shape: api::Shape) -> Result<api::Order, ApiError> {
    let app = app.clone();
    tokio::task::spawn_blocking(move || api::check(asked, shape, &app.pipeline, &app.limits, &app.recipe))
        .await
        .unwrap_or_else(|e| Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("checking the request failed: {e}"))))
}

async fn list_jobs(State(app): State<Arc<App>>) -> Json<serde_json::Value> {
    Json(json!({ "jobs": app.jobs.list().iter().map(|j| j.to_json()).collect::<Vec<_>>() }))
}

async fn show_job(State(app): State<Arc<App>>, UrlPath(id): UrlPath<String>) -> Result<Json<serde_json::Value>, ApiError> {
    let job = app.jobs.find(&id).ok_or_else(|| no_job(&id))?;
    let mut shown = job.to_json();
    shown["queue_position"] = app.jobs.queue_position(&id).into();
    Ok(Json(shown))
}

/// The latest preview of a running job's image, a PNG; 404 before its first step.
async fn job_preview(State(app): State<Arc<App>>, UrlPath(id): UrlPath<String>) -> Result<Response, ApiError> {
    let job = app.jobs.find(&id).ok_or_else(|| no_job(&id))?;
    let preview = job.preview().ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, format!("job {id} has no preview yet")))?;
    let png = base64::engine::general_purpose::STANDARD.decode(preview).map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    Ok(([(axum::http::header::CONTENT_TYPE, "image/png"), (axum::http::header::CACHE_CONTROL, "no-store")], png).into_response())
}

/// What the page needs to know: the model, its defaults and this server's limits.
async fn config(State(app): State<Arc<App>>) -> Json<serde_json::Value> {
    let model = app.pipeline.model();
    let limits = &app.limits.job;
    Json(json!({
        "model": app.recipe.model.name,
        "distilled": model.index.is_distilled,
        "defaults": {
            "steps": pipeline::job::default_steps(model),
            "guidance": pipeline::job::default_guidance(model),
            "width": pipeline::job::DEFAULT_SIDE,
            "height": pipeline::job::DEFAULT_SIDE,
            "strength": pipeline::job::DEFAULT_STRENGTH,
        },
        "limits": {
            "max_side": limits.max_side,
            "max_steps": limits.max_steps,
            "max_images": limits.max_images,
            "size_multiple": model.vae.latent_cell(),
            "references": pipeline::reference_image::MAX_REFERENCES,
        },
        "previews": app.previews,
        "adapter": app.recipe.adapter,
        "tier": app.recipe.precision,
    }))
}

async fn list_gallery(State(app): State<Arc<App>>) -> Json<serde_json::Value> {
    Json(json!({ "images": app.jobs.gallery.list().iter().map(|s| s.to_json()).collect::<Vec<_>>() }))
}

async fn gallery_image(State(app): State<Arc<App>>, UrlPath(id): UrlPath<String>) -> Result<Response, ApiError> {
    let shot = app.jobs.gallery.find(&id).ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, format!("no image {id} (the gallery keeps the newest --gallery images)")))?;
    let name = format!("attachment; filename=\"flux-lite-{}-{}.{}\"", shot.job, shot.seed, shot.format.name().replace("jpeg", "jpg"));
    let headers = [(axum::http::header::CONTENT_TYPE, shot.format.media_type().to_string()), (axum::http::header::CONTENT_DISPOSITION, name)];
    Ok((headers, shot.bytes.to_vec()).into_response())
}

async fn cancel_job(State(app): State<Arc<App>>, UrlPath(id): UrlPath<String>) -> Result<Json<serde_json::Value>, ApiError> {
    let job = app.jobs.find(&id).ok_or_else(|| no_job(&id))?;
    if !app.jobs.cancel(&job) {
        return Err(ApiError::new(StatusCode::CONFLICT, format!("job {id} has already finished ({})", job.status().name())));
    }
    Ok(Json(json!({ "id": id, "cancelled": true })))
}

fn no_job(id: &str) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, format!("no job {id} (finished jobs are forgotten after a while)"))
}

/// AUTOMATIC1111's progress of the running job.
async fn a1111_progress(State(app): State<Arc<App>>) -> Json<serde_json::Value> {
    let running = app.jobs.running();
    let p = running.as_ref().map(|j| j.progress()).unwrap_or_default();
    let steps = running.as_ref().map_or(0, |j| j.order.steps);
    Json(json!({
        "progress": p.fraction,
        "eta_relative": running.as_ref().map_or(0.0, |j| j.eta_seconds()),
        "state": {
            "skipped": false,
            "interrupted": running.as_ref().is_some_and(|j| j.cancel_requested()),
            "job": running.as_ref().map_or(String::new(), |j| j.id.clone()),
            "job_count": app.jobs.waiting(),
            "job_no": p.image,
            "sampling_step": p.step,
            "sampling_steps": steps,
        },
        "current_image": running.as_ref().and_then(|j| j.preview()),
        "textinfo": null,
    }))
}

/// AUTOMATIC1111's interrupt: stops the running job.
async fn a1111_interrupt(State(app): State<Arc<App>>) -> Json<serde_json::Value> {
    let cancelled = app.jobs.running().map(|j| {
        app.jobs.cancel(&j);
        j.id.clone()
    });
    Json(json!({ "cancelled": cancelled }))
}

async fn a1111_models(State(app): State<Arc<App>>) -> Json<serde_json::Value> {
    Json(json!([{ "title": app.model_name, "model_name": app.model_name, "filename": app.model_name }]))
}

/// `POST /sdapi/v1/png-info` `{"image": base64}`: the settings a PNG
/// carries, as A1111 answers: `info` (its `parameters` text), `items` (its
/// other text chunks, our `flux-lite` recipe among them) and `parameters`
/// (the infotext's fields by key).
async fn a1111_png_info(body: Result<Bytes, BytesRejection>) -> Result<Json<serde_json::Value>, ApiError> {
    #[derive(serde::Deserialize)]
    struct Asked {
        image: String,
    }
    let asked: Asked = parse(body)?;
    let bytes = api::decode_base64("image", &asked.image)?;
    let chunks = flux_lite_platform::pipeline::image_file::image_text(&bytes).map_err(|e| ApiError::bad(format!("image: {e}")))?;
    let info = chunks.iter().find(|(k, _)| k == crate::recipe::A1111_CHUNK).map(|(_, v)| v.clone()).unwrap_or_default();
    // The input images a PNG keeps are named, not sent back: they can be megabytes.
    let items: serde_json::Map<String, serde_json::Value> = chunks
        .into_iter()
        .filter(|(k, _)| k != crate::recipe::A1111_CHUNK)
        .map(|(k, v)| match k.starts_with(crate::recipe::INPUT_CHUNK) {
            true => (k, format!("{} bytes of base64", v.len()).into()),
            false => (k, v.into()),
        })
        .collect();
    let parameters = match info.is_empty() {
        true => json!({}),
        false => crate::recipe::Infotext::parse(&info).to_json(),
    };
    Ok(Json(json!({ "info": info, "items": items, "parameters": parameters })))
}

async fn a1111_options(State(app): State<Arc<App>>) -> Json<serde_json::Value> {
    Json(json!({ "sd_model_checkpoint": app.model_name }))
}

/// Front ends set options (the checkpoint, …); one model is served, so they change nothing.
async fn a1111_set_options(body: Result<Bytes, BytesRejection>) -> Result<Json<serde_json::Value>, ApiError> {
    let _: serde_json::Value = parse(body)?;
    Ok(Json(json!({})))
}
