//! OpenAI's streamed image answer (`stream: true`): server-sent events, as
//! the Images API streams them: up to `partial_images`
//! `image_generation.partial_image` events while the job runs (the latest
//! preview of the image forming, each new one once), then one
//! `image_generation.completed` event per image, or one `error` event. A
//! client that goes away cancels its job, as an unstreamed one does.

use super::jobs::{JobState, Jobs, Outcome};
use super::{b64, now, with_job_header, CancelOnDrop};
use axum::body::{Body, Bytes};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::Response;
use serde_json::json;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// How often a running job's preview is looked at.
const POLL: Duration = Duration::from_millis(50);

/// The streamed answer to a submitted job.
pub fn events(jobs: Arc<Jobs>, state: Arc<JobState>, outcome: oneshot::Receiver<Outcome>, partials: usize, size: String, format: &'static str) -> Response {
    let (tx, rx) = mpsc::channel::<Bytes>(8);
    let id = state.id.clone();
    tokio::spawn(feed(jobs, state, outcome, (partials, format), size, tx));
    let body = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|event| (Ok::<_, Infallible>(event), rx)) });
    let response = Response::builder()
        .header(CONTENT_TYPE, "text/event-stream")
        .header(CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(body))
        .unwrap_or_default();
    with_job_header(response, &id)
}

/// One server-sent event.
fn event(kind: &str, data: serde_json::Value) -> Bytes {
    Bytes::from(format!("event: {kind}\ndata: {data}\n\n"))
}

/// Sends the job's partial images while it runs, then its images.
/// `asked`: the partial images asked for, and the images' format (the partials are PNG).
async fn feed(jobs: Arc<Jobs>, state: Arc<JobState>, mut outcome: oneshot::Receiver<Outcome>, asked: (usize, &'static str), size: String, tx: mpsc::Sender<Bytes>) {
    let (partials, format) = asked;
    let guard = CancelOnDrop { jobs, state: Some(state.clone()) };
    let mut sent = 0;
    let mut last: Option<String> = None;
    // The latest preview, if it is new and more partials are asked for.
    let mut partial = |sent: &mut usize| {
        let preview = state.preview().filter(|p| *sent < partials && last.as_ref() != Some(p))?;
        last = Some(preview.clone());
        let data = json!({
            "type": "image_generation.partial_image",
            "b64_json": preview,
            "created_at": now(),
            "size": size,
            "output_format": "png",
            "partial_image_index": *sent,
        });
        *sent += 1;
        Some(event("image_generation.partial_image", data))
    };
    let finished = loop {
        tokio::select! {
            result = &mut outcome => break result,
            _ = tokio::time::sleep(POLL) => {
                if let Some(e) = partial(&mut sent) {
                    if tx.send(e).await.is_err() {
                        return; // the client went away: the guard cancels the job
                    }
                }
                if tx.is_closed() {
                    return;
                }
            }
        }
    };
    guard.disarm();
    // A job faster than the polling still shows its last preview first.
    if let Some(e) = partial(&mut sent) {
        let _ = tx.send(e).await;
    }
    match finished {
        Ok(Ok(pictures)) => {
            for picture in pictures {
                let data = json!({
                    "type": "image_generation.completed",
                    "b64_json": b64(&picture.bytes),
                    "created_at": now(),
                    "size": size,
                    "output_format": format,
                    "seed": picture.seed,
                });
                if tx.send(event("image_generation.completed", data)).await.is_err() {
                    return;
                }
            }
        }
        Ok(Err(e)) => {
            let _ = tx.send(event("error", json!({ "type": "error", "error": { "message": e.message, "status": e.status.as_u16() } }))).await;
        }
        Err(_) => {
            let _ = tx.send(event("error", json!({ "type": "error", "error": { "message": "the GPU worker stopped", "status": 503 } }))).await;
        }
    }
}
