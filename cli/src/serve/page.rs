//! The page people open: `GET /` and its script and style, built into the
//! binary (no build step, nothing fetched from another host, works offline).
//! It speaks the same API as any other client (docs/serve.md).

use axum::http::header::{HeaderValue, CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};

const INDEX: &str = include_str!("page/index.html");
const SCRIPT: &str = include_str!("page/page.js");
const STYLE: &str = include_str!("page/page.css");

/// The paths the page is made of; they answer without the API key (the
/// page asks for it and sends it with its own requests).
pub const PATHS: [&str; 3] = ["/", "/page.js", "/page.css"];

/// Everything from this server, images also from data and blob URLs the page makes.
const POLICY: &str = "default-src 'self'; img-src 'self' data: blob:; style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'";

fn file(body: &'static str, kind: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(kind));
    headers.insert(CONTENT_SECURITY_POLICY, HeaderValue::from_static(POLICY));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

pub async fn index() -> Response {
    file(INDEX, "text/html; charset=utf-8")
}

pub async fn script() -> Response {
    file(SCRIPT, "text/javascript; charset=utf-8")
}

pub async fn style() -> Response {
    file(STYLE, "text/css; charset=utf-8")
}
