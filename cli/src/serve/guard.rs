//! Who may talk to the server. A server on a local port can be reached by
//! every web page its user opens: a page elsewhere must not drive it
//! (`Origin`), and a name that merely resolves to this machine must not
//! pass for it (`Host`, against DNS rebinding). Requests without an
//! `Origin` (curl, scripts, other programs) are not browsers' and pass;
//! the API key, where there is one, still applies to them.

use super::api::ApiError;
use axum::extract::{Request as HttpRequest, State};
use axum::http::header::{HeaderValue, ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS, ACCESS_CONTROL_ALLOW_ORIGIN, ACCESS_CONTROL_MAX_AGE, HOST, ORIGIN, VARY};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::net::IpAddr;
use std::sync::Arc;

/// The names and origins the server answers to.
#[derive(Debug, Clone)]
pub struct Guard {
    /// The address it listens on.
    pub bound: IpAddr,
    /// Host names beside `localhost` and the bound address (`--allow-host`).
    pub hosts: Vec<String>,
    /// Origins beside the server's own whose pages may use it (`--allow-origin`; `*`: any).
    pub origins: Vec<String>,
}

impl Guard {
    /// Whether a `Host` header's name is this server's.
    pub fn host_allowed(&self, host: &str) -> bool {
        let name = host_name(host);
        if name.eq_ignore_ascii_case("localhost") || self.hosts.iter().any(|h| h.eq_ignore_ascii_case(name)) {
            return true;
        }
        match name.parse::<IpAddr>() {
            // Listening on every address, any of the machine's addresses may be asked for.
            Ok(ip) => self.bound.is_unspecified() || ip == self.bound || (self.bound.is_loopback() && ip.is_loopback()),
            Err(_) => false,
        }
    }

    /// Whether a page at `origin` may use the server reached as `host`: its
    /// own page (same origin), or one `--allow-origin` names.
    pub fn origin_allowed(&self, origin: &str, host: Option<&str>) -> bool {
        let own = host.is_some_and(|h| origin.eq_ignore_ascii_case(&format!("http://{h}")));
        own || self.origins.iter().any(|o| o == "*" || o.eq_ignore_ascii_case(origin))
    }

    /// Whether `origin` is another site's that `--allow-origin` lets in
    /// (its answers then carry CORS headers).
    fn cross_origin_allowed(&self, origin: &str, host: Option<&str>) -> bool {
        let own = host.is_some_and(|h| origin.eq_ignore_ascii_case(&format!("http://{h}")));
        !own && self.origin_allowed(origin, host)
    }
}

fn header(request: &HttpRequest, name: axum::http::HeaderName) -> Option<String> {
    request.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string)
}

/// `host:port`, `[v6]:port` or a bare name → the name (brackets dropped).
fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.chars().all(|c| c.is_ascii_digit()) => name,
        _ => host,
    }
}

/// Refuses a foreign `Host` (421) or `Origin` (403), answers an allowed
/// origin's preflight, and marks an allowed origin's answers for its browser.
pub async fn check(State(guard): State<Arc<Guard>>, request: HttpRequest, next: Next) -> Response {
    let host = header(&request, HOST);
    let origin = header(&request, ORIGIN);
    if let Some(h) = &host {
        if !guard.host_allowed(h) {
            let why = format!("Host {h:?} is not this server's name (localhost or its address); give --allow-host {} to serve it under that name", host_name(h));
            return ApiError::new(StatusCode::MISDIRECTED_REQUEST, why).into_response();
        }
    }
    let Some(origin) = origin else { return next.run(request).await };
    if !guard.origin_allowed(&origin, host.as_deref()) {
        let why = format!("Origin {origin} is not this server's own page; start it with --allow-origin {origin} to let that page use it");
        return ApiError::new(StatusCode::FORBIDDEN, why).into_response();
    }
    let cors = guard.cross_origin_allowed(&origin, host.as_deref());
    let mut response = match (request.method() == Method::OPTIONS, cors) {
        (true, true) => {
            let mut preflight = StatusCode::NO_CONTENT.into_response();
            let h = preflight.headers_mut();
            h.insert(ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static("GET, POST, DELETE, OPTIONS"));
            h.insert(ACCESS_CONTROL_ALLOW_HEADERS, HeaderValue::from_static("authorization, content-type, x-job-id"));
            h.insert(ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
            preflight
        }
        _ => next.run(request).await,
    };
    if cors {
        if let Ok(v) = HeaderValue::from_str(&origin) {
            response.headers_mut().insert(ACCESS_CONTROL_ALLOW_ORIGIN, v);
            response.headers_mut().insert(VARY, HeaderValue::from_static("Origin"));
        }
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(bound: [u8; 4]) -> Guard {
        Guard { bound: IpAddr::from(bound), hosts: vec!["studio.lan".into()], origins: vec!["http://localhost:3000".into()] }
    }

    #[test]
    fn hosts_are_localhost_the_bound_address_and_the_names_allowed() {
        let g = guard([127, 0, 0, 1]);
        for ok in ["localhost:7860", "LOCALHOST", "127.0.0.1:7860", "127.0.0.2:7860", "[::1]:7860", "studio.lan:80"] {
            assert!(g.host_allowed(ok), "{ok}");
        }
        for refused in ["evil.example:7860", "192.168.1.5:7860", "localhost.evil.example", "[2001:db8::1]:7860"] {
            assert!(!g.host_allowed(refused), "{refused}");
        }
        // Listening everywhere: any address of the machine, still no foreign name.
        let everywhere = guard([0, 0, 0, 0]);
        assert!(everywhere.host_allowed("192.168.1.5:7860") && !everywhere.host_allowed("evil.example:7860"));
    }

    #[test]
    fn origins_are_the_servers_own_and_the_ones_allowed() {
        let g = guard([127, 0, 0, 1]);
        assert!(g.origin_allowed("http://127.0.0.1:7860", Some("127.0.0.1:7860")));
        assert!(g.origin_allowed("http://localhost:3000", Some("127.0.0.1:7860")));
        assert!(g.cross_origin_allowed("http://localhost:3000", Some("127.0.0.1:7860")));
        assert!(!g.cross_origin_allowed("http://127.0.0.1:7860", Some("127.0.0.1:7860")));
        for refused in ["http://evil.example", "null", "https://127.0.0.1:7860", "http://127.0.0.1:7861"] {
            assert!(!g.origin_allowed(refused, Some("127.0.0.1:7860")), "{refused}");
        }
        let any = Guard { origins: vec!["*".into()], ..g };
        assert!(any.origin_allowed("http://evil.example", Some("127.0.0.1:7860")));
    }
}
