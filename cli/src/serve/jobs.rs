//! The server's jobs: a bounded queue in front of one GPU worker thread, each
//! job's state (queued, running with its progress, finished) for the poll
//! endpoints, and cancellation of a queued or running job.

use super::api::{ApiError, Order};
use super::metrics::Outcome as MetricOutcome;
use axum::http::StatusCode;
use flux_lite_platform::pipeline::{image_file, Made, Observer, Pipeline, Progress};
use flux_lite_platform::{GpuError, RunError};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::oneshot;

/// Finished jobs the poll endpoints still show.
const FINISHED_KEPT: usize = 32;

/// One image a job made: its seed and its file (in the order's format).
#[derive(Debug, Clone)]
pub struct Picture {
    pub seed: u64,
    pub bytes: Vec<u8>,
}

/// What a job ends with.
pub type Outcome = Result<Vec<Picture>, ApiError>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Queued,
    Running,
    Done,
    Failed,
    Cancelled,
}

impl Status {
    pub fn name(self) -> &'static str {
        match self {
            Status::Queued => "queued",
            Status::Running => "running",
            Status::Done => "done",
            Status::Failed => "failed",
            Status::Cancelled => "cancelled",
        }
    }
}

/// Where a running job is.
#[derive(Debug, Clone, Copy, Default)]
pub struct JobProgress {
    /// 0 to 1 over all its images' denoising steps (decoding is quick beside them).
    pub fraction: f64,
    /// The image being made (0-based) and the step of its denoising.
    pub image: usize,
    pub step: usize,
}

/// A job as the poll endpoints and the canceller see it.
#[derive(Debug)]
pub struct JobState {
    pub id: String,
    /// Seconds since the epoch when it was queued.
    pub created: u64,
    pub order: OrderSummary,
    status: Mutex<Status>,
    progress: Mutex<JobProgress>,
    /// The latest preview of the image being denoised, as a base64 PNG.
    preview: Mutex<Option<String>>,
    /// When it started running.
    started: Mutex<Option<Instant>>,
    cancel: AtomicBool,
}

/// What a job makes, for the job listing.
#[derive(Debug, Clone)]
pub struct OrderSummary {
    pub width: usize,
    pub height: usize,
    pub steps: usize,
    pub count: usize,
    pub seed: u64,
}

impl JobState {
    pub fn status(&self) -> Status {
        *lock(&self.status)
    }

    pub fn progress(&self) -> JobProgress {
        *lock(&self.progress)
    }

    /// Seconds until it finishes, from its pace so far (0 before it has any).
    pub fn eta_seconds(&self) -> f64 {
        let fraction = self.progress().fraction;
        match *lock(&self.started) {
            Some(start) if fraction > 0.0 => start.elapsed().as_secs_f64() * (1.0 - fraction) / fraction,
            _ => 0.0,
        }
    }

    /// The latest preview (base64 PNG), once a step has been drawn.
    pub fn preview(&self) -> Option<String> {
        lock(&self.preview).clone()
    }

    fn set(&self, status: Status) {
        *lock(&self.status) = status;
    }

    pub fn cancel_requested(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }

    pub fn to_json(&self) -> serde_json::Value {
        let p = self.progress();
        let o = &self.order;
        serde_json::json!({
            "id": self.id,
            "status": self.status().name(),
            "created": self.created,
            "progress": p.fraction,
            "image": p.image,
            "step": p.step,
            "width": o.width,
            "height": o.height,
            "steps": o.steps,
            "n": o.count,
            "seed": o.seed,
        })
    }
}

/// A queued job: the order, its state, and where its outcome goes.
#[derive(Debug)]
pub struct Job {
    order: Order,
    state: Arc<JobState>,
    reply: oneshot::Sender<Outcome>,
}

/// The queue and the jobs it knows, shared by every handler and the worker.
#[derive(Debug)]
pub struct Jobs {
    queue: Mutex<Option<SyncSender<Job>>>,
    /// Queued, running and the last finished jobs, oldest first.
    known: Mutex<VecDeque<Arc<JobState>>>,
    next_id: AtomicU64,
    /// The GPU's interrupt flag: set, the running job stops at its next block.
    interrupt: Arc<AtomicBool>,
    shutting_down: AtomicBool,
    /// What `/metrics` reports of the jobs.
    pub metrics: super::metrics::Metrics,
    /// The images finished jobs made, for the page.
    pub gallery: super::gallery::Gallery,
}

impl Jobs {
    /// The queue holds `capacity` jobs beside the running one; the gallery
    /// keeps the last `gallery` images.
    pub fn new(capacity: usize, gallery: usize, interrupt: Arc<AtomicBool>) -> (Arc<Self>, Receiver<Job>) {
        let (tx, rx) = std::sync::mpsc::sync_channel(capacity);
        let jobs = Arc::new(Self {
            queue: Mutex::new(Some(tx)),
            known: Mutex::new(VecDeque::new()),
            next_id: AtomicU64::new(1),
            interrupt,
            shutting_down: AtomicBool::new(false),
            metrics: super::metrics::Metrics::default(),
            gallery: super::gallery::Gallery::new(gallery),
        });
        (jobs, rx)
    }

    /// Queues `order` under `id` (the client's `X-Job-Id`, else the next number),
    /// or answers at once: 503 when the queue is full or the server stopping,
    /// 409 when the id is taken by a job not yet finished.
    pub fn submit(&self, order: Order, id: Option<String>) -> Result<(Arc<JobState>, oneshot::Receiver<Outcome>), ApiError> {
        let submitted = self.queue_up(order, id);
        if submitted.as_ref().is_err_and(|e| e.status == StatusCode::SERVICE_UNAVAILABLE) {
            self.metrics.count(MetricOutcome::Refused);
        }
        submitted
    }

    fn queue_up(&self, order: Order, id: Option<String>) -> Result<(Arc<JobState>, oneshot::Receiver<Outcome>), ApiError> {
        if self.shutting_down.load(Ordering::SeqCst) {
            return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the server is shutting down"));
        }
        let mut known = lock(&self.known);
        let id = id.unwrap_or_else(|| format!("job-{}", self.next_id.fetch_add(1, Ordering::Relaxed)));
        if known.iter().any(|j| j.id == id && matches!(j.status(), Status::Queued | Status::Running)) {
            return Err(ApiError::new(StatusCode::CONFLICT, format!("job {id} is already queued or running")));
        }
        let r = order.job.request();
        let summary = OrderSummary { width: r.width, height: r.height, steps: r.steps, count: order.job.images(), seed: r.seed };
        let created = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let state = Arc::new(JobState { id, created, order: summary, status: Mutex::new(Status::Queued), progress: Mutex::default(), preview: Mutex::default(), started: Mutex::default(), cancel: AtomicBool::new(false) });
        let (reply, outcome) = oneshot::channel();
        let queue = lock(&self.queue);
        let Some(tx) = queue.as_ref() else {
            return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the server is shutting down"));
        };
        match tx.try_send(Job { order, state: state.clone(), reply }) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => return Err(ApiError::busy()),
            Err(TrySendError::Disconnected(_)) => return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the GPU worker has stopped")),
        }
        known.push_back(state.clone());
        forget_old(&mut known);
        Ok((state, outcome))
    }

    /// Every known job, oldest first.
    pub fn list(&self) -> Vec<Arc<JobState>> {
        lock(&self.known).iter().cloned().collect()
    }

    pub fn find(&self, id: &str) -> Option<Arc<JobState>> {
        lock(&self.known).iter().find(|j| j.id == id).cloned()
    }

    /// Jobs queued, and running (0 or 1).
    pub fn counts(&self) -> (usize, usize) {
        let known = lock(&self.known);
        let count = |status| known.iter().filter(|j| j.status() == status).count();
        (count(Status::Queued), count(Status::Running))
    }

    /// Jobs queued or running.
    pub fn waiting(&self) -> usize {
        lock(&self.known).iter().filter(|j| matches!(j.status(), Status::Queued | Status::Running)).count()
    }

    /// How many queued jobs are ahead of job `id` (0: it runs next);
    /// `None` unless it is queued.
    pub fn queue_position(&self, id: &str) -> Option<usize> {
        let known = lock(&self.known);
        let queued: Vec<&Arc<JobState>> = known.iter().filter(|j| j.status() == Status::Queued).collect();
        queued.iter().position(|j| j.id == id)
    }

    pub fn running(&self) -> Option<Arc<JobState>> {
        lock(&self.known).iter().find(|j| j.status() == Status::Running).cloned()
    }

    /// Asks `job` to stop: a queued job is dropped when its turn comes, a
    /// running one stops at its next block. False when it had finished.
    pub fn cancel(&self, job: &JobState) -> bool {
        job.cancel.store(true, Ordering::SeqCst);
        match job.status() {
            Status::Running => {
                self.interrupt.store(true, Ordering::SeqCst);
                true
            }
            Status::Queued => true,
            _ => false,
        }
    }

    /// Takes no more jobs, stops the running one, and lets the worker answer
    /// the queued ones and end.
    pub fn shut_down(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        self.interrupt.store(true, Ordering::SeqCst);
        lock(&self.queue).take();
    }
}

fn forget_old(known: &mut VecDeque<Arc<JobState>>) {
    while known.iter().filter(|j| matches!(j.status(), Status::Done | Status::Failed | Status::Cancelled)).count() > FINISHED_KEPT {
        let Some(i) = known.iter().position(|j| matches!(j.status(), Status::Done | Status::Failed | Status::Cancelled)) else { break };
        known.remove(i);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What the worker needs beside the queue.
#[derive(Debug)]
pub struct Worker {
    pub pipeline: Arc<Pipeline>,
    pub jobs: Arc<Jobs>,
    /// How the PNGs name the model (`--model` as given).
    pub verbose: bool,
    /// Whether jobs draw a preview after each step (for `/sdapi/v1/progress`).
    pub previews: bool,
}

impl Worker {
    /// Runs queued jobs one at a time until the queue is closed and drained.
    pub fn run(self, queue: Receiver<Job>) {
        while let Ok(job) = queue.recv() {
            let state = job.state.clone();
            let outcome = if self.jobs.shutting_down.load(Ordering::SeqCst) {
                Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the server is shutting down"))
            } else if state.cancel_requested() {
                Err(ApiError::cancelled(&state.id))
            } else {
                self.run_job(&job)
            };
            let (status, counted) = match &outcome {
                Ok(_) => (Status::Done, MetricOutcome::Done),
                Err(e) if e.status == StatusCode::CONFLICT => (Status::Cancelled, MetricOutcome::Cancelled),
                Err(_) => (Status::Failed, MetricOutcome::Failed),
            };
            state.set(status);
            self.jobs.metrics.count(counted);
            // The client may have gone: its job's outcome is then dropped.
            let _ = job.reply.send(outcome);
        }
    }

    fn run_job(&self, job: &Job) -> Outcome {
        let state = &job.state;
        let order = &job.order;
        state.set(Status::Running);
        *lock(&state.started) = Some(Instant::now());
        // A cancel that came while the job was moving from the queue still counts.
        self.jobs.interrupt.store(state.cancel_requested() || self.jobs.shutting_down.load(Ordering::SeqCst), Ordering::SeqCst);
        let started = Instant::now();
        let request = order.job.request();
        let count = order.job.images();
        let mut watch = Watch { jobs: &self.jobs, state, steps: request.steps, count, previews: self.previews };
        let mut pictures = Vec::with_capacity(count);
        let mut take = |made: Made| {
            let Some(image) = made.image else { return Err(RunError::Internal("no image was decoded".into())) };
            let recipe = order.run.recipe(order.prompt(), made.seed, request);
            let mut text: Vec<(String, String)> = recipe.chunks().into_iter().map(|(k, v)| (k.to_string(), v)).collect();
            // A PNG keeps the images the request sent, so it can be made again from itself.
            if order.format == image_file::ImageFormat::Png {
                text.extend(order.inputs.iter().map(|(field, bytes)| crate::recipe::input_chunk(field, bytes)));
            }
            let text: Vec<(&str, String)> = text.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
            let bytes = image_file::encode_image(order.format, image.width as u32, image.height as u32, &image.rgb, &text).map_err(RunError::Output)?;
            self.jobs.gallery.add(&state.id, made.seed, order.format, bytes.clone(), serde_json::to_value(&recipe).unwrap_or_default());
            pictures.push(Picture { seed: made.seed, bytes });
            Ok(())
        };
        let result = self.pipeline.run(&order.job, &mut watch, &mut take);
        self.jobs.interrupt.store(false, Ordering::SeqCst);
        let seconds = started.elapsed().as_secs_f64();
        match result {
            Ok(finished) => {
                let steps: Vec<f64> = finished.timings.steps.iter().map(|d| d.as_secs_f64()).collect();
                self.jobs.metrics.record(count, seconds, &steps, finished.plan.device_peak());
                let reused = if finished.reused.is_empty() { "nothing".to_string() } else { finished.reused.join(", ") };
                eprintln!(
                    "{}: {} image(s) {}x{}, {} steps, seed {}: {seconds:.2}s{}",
                    state.id,
                    count,
                    request.width,
                    request.height,
                    request.steps,
                    request.seed,
                    if self.verbose { format!(" (reused: {reused})") } else { String::new() }
                );
                Ok(pictures)
            }
            Err(RunError::Gpu(GpuError::Interrupted)) if self.jobs.shutting_down.load(Ordering::SeqCst) => {
                eprintln!("{}: stopped, the server is shutting down", state.id);
                Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the server is shutting down; the job was stopped"))
            }
            Err(RunError::Gpu(GpuError::Interrupted)) => {
                eprintln!("{}: cancelled after {seconds:.2}s", state.id);
                Err(ApiError::cancelled(&state.id))
            }
            Err(e) => {
                let line = crate::errors::run_line(&e);
                eprintln!("{}: failed: {line}", state.id);
                Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, line))
            }
        }
    }
}

/// A running job's progress, and its cancel flag passed to the GPU.
struct Watch<'a> {
    jobs: &'a Jobs,
    state: &'a JobState,
    steps: usize,
    count: usize,
    /// Whether to draw a preview after each step (the model's VAE has a latent-to-RGB map).
    previews: bool,
}

impl Observer for Watch<'_> {
    fn progress(&mut self, p: Progress) {
        if self.state.cancel_requested() {
            self.jobs.interrupt.store(true, Ordering::SeqCst);
        }
        if let Progress::Denoise(s) = p {
            let mut progress = lock(&self.state.progress);
            let per_image = (self.steps * s.block.total).max(1) as f64;
            let done = (s.step * s.block.total + s.block.done) as f64 / per_image;
            progress.step = s.step;
            progress.fraction = (progress.image as f64 + done) / self.count.max(1) as f64;
        }
    }

    fn image(&mut self, index: usize, _count: usize) {
        lock(&self.state.progress).image = index;
    }

    fn previews(&self) -> Option<usize> {
        self.previews.then_some(1)
    }

    fn preview(&mut self, p: &flux_lite_platform::pipeline::Preview<'_>) {
        use base64::Engine;
        if let Ok(png) = image_file::encode_png(p.width as u32, p.height as u32, p.rgb, &[]) {
            *lock(&self.state.preview) = Some(base64::engine::general_purpose::STANDARD.encode(png));
        }
    }
}
