//! serve's page in a real browser: Debian's Chromium, headless, driven
//! through chromedriver (WebDriver) from fantoccini. A person's steps: an
//! image generated and compared with `gen`'s pixels, a preview seen before
//! the image, a mask painted with the mouse giving what `gen --mask` gives
//! for that mask, a job cancelled, a refusal shown beside its field, the
//! API key asked for once, and the page at a phone's width.
//!
//! Without chromedriver the tests say `skipped:` and pass, unless
//! `FLUX_LITE_REQUIRE_BROWSER` is set (CI sets it: ci/setup-browser.sh
//! installs Chromium). With `FLUX_LITE_PAGE_SCREENSHOTS=DIR` each state's
//! screenshot is written there (docs/page/ keeps them for the README).

#![allow(clippy::unwrap_used)]

mod support;

use base64::Engine;
use fantoccini::actions::{InputSource, MouseActions, PointerAction, MOUSE_BUTTON_LEFT};
use fantoccini::{Client, ClientBuilder, Locator};
use flux_lite_tests::{read_png, scratch_dir, Goldens};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::Server;

/// Chromium under chromedriver, both stopped when dropped.
struct Browser {
    driver: Child,
    client: Client,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

fn chromedriver() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join("chromedriver")).find(|p| p.is_file())
}

/// A headless browser of `width`×`height`, or `None` (said) where this machine has none.
async fn browser(width: u32, height: u32) -> Option<Browser> {
    let Some(driver_path) = chromedriver() else {
        assert!(std::env::var_os("FLUX_LITE_REQUIRE_BROWSER").is_none(), "FLUX_LITE_REQUIRE_BROWSER is set but chromedriver is not on PATH (ci/setup-browser.sh installs it)");
        flux_lite_tests::skipped("no chromedriver on PATH (Debian: apt-get install chromium chromium-driver)");
        return None;
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let driver = Command::new(driver_path).arg(format!("--port={port}")).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let mut capabilities = serde_json::Map::new();
    let args = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", &format!("--window-size={width},{height}")];
    capabilities.insert("goog:chromeOptions".into(), serde_json::json!({ "args": args }));
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    let started = Instant::now();
    let client = loop {
        match ClientBuilder::new(connector.clone()).capabilities(capabilities.clone()).connect(&format!("http://127.0.0.1:{port}")).await {
            Ok(client) => break client,
            Err(e) if started.elapsed() > Duration::from_secs(60) => panic!("chromedriver did not start a session: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    Some(Browser { driver, client })
}

/// Opens the page and waits until it has the server's settings.
async fn open(c: &Client, server: &Server) {
    c.goto(&server.url).await.unwrap();
    c.wait().at_most(Duration::from_secs(30)).for_element(Locator::Css("body[data-ready=yes]")).await.unwrap();
}

async fn set(c: &Client, id: &str, value: &str) {
    let field = c.find(Locator::Id(id)).await.unwrap();
    field.clear().await.unwrap();
    field.send_keys(value).await.unwrap();
}

async fn click(c: &Client, css: &str) {
    c.find(Locator::Css(css)).await.unwrap().click().await.unwrap();
}

async fn script(c: &Client, js: &str) -> serde_json::Value {
    c.execute(js, vec![]).await.unwrap()
}

async fn text(c: &Client, id: &str) -> String {
    script(c, &format!("return document.getElementById('{id}').textContent")).await.as_str().unwrap_or_default().to_string()
}

/// Waits for the job's end: `done`, `cancelled`, `refused` or `failed`.
async fn ended(c: &Client, within: Duration) -> String {
    let started = Instant::now();
    loop {
        let state = script(c, "return document.getElementById('status').dataset.state || ''").await;
        let state = state.as_str().unwrap_or_default();
        if !state.is_empty() && c.find(Locator::Css("#generate:not([disabled])")).await.is_ok() {
            return state.to_string();
        }
        assert!(started.elapsed() < within, "the job did not end within {within:?}; status: {}", text(c, "status").await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Writes the screenshot of this state where `FLUX_LITE_PAGE_SCREENSHOTS` says.
async fn screenshot(c: &Client, name: &str) {
    if let Some(dir) = std::env::var_os("FLUX_LITE_PAGE_SCREENSHOTS") {
        let png = c.screenshot().await.unwrap();
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(Path::new(&dir).join(format!("{name}.png")), png).unwrap();
    }
}

/// The RGB of a `data:image/png;base64,…` URL.
fn pixels_of(data_url: &str, dir: &Path, name: &str) -> flux_lite_tests::Png {
    let (_, b64) = data_url.split_once(',').unwrap();
    let path = dir.join(name);
    std::fs::write(&path, base64::engine::general_purpose::STANDARD.decode(b64).unwrap()).unwrap();
    read_png(&path)
}

async fn result_src(c: &Client) -> String {
    c.find(Locator::Css("#results img")).await.unwrap().attr("src").await.unwrap().unwrap()
}

/// `gen`'s pixels for the same settings, on the f32 tier the server runs.
fn gen_pixels(dir: &Path, args: &[&str]) -> Vec<u8> {
    let out = dir.join("gen.png");
    let run = support::gen_f32("tiny-a", args, &out);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    read_png(&out).rgb
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_generates_an_image_and_gets_gens_pixels_and_the_gallery_keeps_it() {
    let Some(b) = browser(1280, 1000).await else { return };
    let c = &b.client;
    let dir = scratch_dir("page-generate");
    let server = Server::start(&[]);
    open(c, &server).await;
    // A distilled model: the negative prompt's field is not offered.
    assert_eq!(script(c, "return document.getElementById('negative-field').hidden").await, true);
    set(c, "prompt", "a red fox in the snow").await;
    for (id, value) in [("width", "32"), ("height", "32"), ("steps", "2")] {
        set(c, id, value).await;
    }
    click(c, "#random-seed").await;
    set(c, "seed", "42").await;
    click(c, "#generate").await;
    assert_eq!(ended(c, Duration::from_secs(120)).await, "done");
    let shown = pixels_of(&result_src(c).await, &dir, "page.png");
    let made = gen_pixels(&dir, &["--prompt", "a red fox in the snow", "--width", "32", "--height", "32", "--steps", "2", "--seed", "42"]);
    assert!(shown.rgb == made, "the page's image differs from gen's");
    // The gallery lists it with its settings; "use these settings" fills the form again.
    c.wait().at_most(Duration::from_secs(10)).for_element(Locator::Css("#gallery li img")).await.unwrap();
    let caption = text(c, "gallery").await;
    assert!(caption.contains("a red fox in the snow") && caption.contains("32×32, 2 steps") && caption.contains("seed 42"), "{caption}");
    let download = c.find(Locator::Css("#gallery li a[download]")).await.unwrap();
    assert!(download.attr("download").await.unwrap().unwrap().ends_with("-42.png"));
    screenshot(c, "generated").await;
    set(c, "prompt", "something else").await;
    click(c, "#gallery li button").await;
    assert_eq!(script(c, "return document.getElementById('prompt').value").await, "a red fox in the snow");
    assert_eq!(script(c, "return document.getElementById('seed').value").await, "42");
    // Every control has a name a screen reader says, and the keyboard reaches it.
    let unnamed = script(c, "return [...document.querySelectorAll('input, textarea, button, select')].filter(e => !(e.labels && e.labels.length) && !e.getAttribute('aria-label') && !e.textContent.trim()).map(e => e.id)").await;
    assert_eq!(unnamed, serde_json::json!([]), "controls without a name");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_forming_shows_before_the_image() {
    let Some(b) = browser(1280, 1000).await else { return };
    let c = &b.client;
    let server = Server::start(&["--max-steps", "400"]);
    open(c, &server).await;
    set(c, "prompt", "a lighthouse").await;
    for (id, value) in [("width", "64"), ("height", "64"), ("steps", "40")] {
        set(c, id, value).await;
    }
    click(c, "#generate").await;
    let started = Instant::now();
    loop {
        let seen = script(c, "return !document.getElementById('preview-box').hidden && document.getElementById('preview').src.startsWith('blob:')").await;
        if seen == true {
            break;
        }
        assert!(c.find(Locator::Css("#results img")).await.is_err(), "the image came before any preview");
        assert!(started.elapsed() < Duration::from_secs(120), "no preview: {}", text(c, "status").await);
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let status = text(c, "status").await;
    assert!(status.starts_with("step ") && status.contains(" of 40"), "{status}");
    screenshot(c, "running").await;
    assert_eq!(ended(c, Duration::from_secs(300)).await, "done");
    assert!(c.find(Locator::Css("#results img")).await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mask_painted_with_the_mouse_inpaints_as_gen_mask_does() {
    let Some(b) = browser(1280, 1100).await else { return };
    let c = &b.client;
    let dir = scratch_dir("page-mask");
    let server = Server::start(&[]);
    open(c, &server).await;
    // WebDriver takes a file to upload by its canonical path.
    let init = Goldens::dir("tiny-a/inpaint-rect").join("init.png").canonicalize().unwrap();
    click(c, "#init-box summary").await;
    c.find(Locator::Id("init-file")).await.unwrap().send_keys(init.to_str().unwrap()).await.unwrap();
    c.wait().at_most(Duration::from_secs(10)).for_element(Locator::Css("#mask-tools:not([hidden])")).await.unwrap();
    // A stroke across the picture, then a smaller one erased from it.
    let canvas = c.find(Locator::Id("mask-canvas")).await.unwrap();
    let stroke = |id: &str, dx: f64, dy: f64| {
        MouseActions::new(id.to_string())
            .then(PointerAction::MoveToElement { element: canvas.clone(), duration: None, x: -150.0, y: -60.0 })
            .then(PointerAction::Down { button: MOUSE_BUTTON_LEFT })
            .then(PointerAction::MoveBy { duration: Some(Duration::from_millis(150)), x: dx, y: dy })
            .then(PointerAction::Up { button: MOUSE_BUTTON_LEFT })
    };
    c.perform_actions(stroke("paint", 300.0, 120.0)).await.unwrap();
    click(c, "input[name=brush][value=erase]").await;
    c.perform_actions(stroke("erase", 60.0, 24.0)).await.unwrap();
    let href = c.find(Locator::Id("mask-download")).await.unwrap().attr("href").await.unwrap().unwrap();
    let (_, b64) = href.split_once(',').unwrap();
    let mask_png = base64::engine::general_purpose::STANDARD.decode(b64).unwrap();
    std::fs::write(dir.join("mask.png"), &mask_png).unwrap();
    // A canvas's PNG is RGBA: read as the mask's grey levels.
    let mask = image::load_from_memory(&mask_png).unwrap().to_luma8();
    assert_eq!(mask.dimensions(), (66, 50), "the mask is the picture's size");
    let white = mask.as_raw().iter().filter(|&&v| v >= 128).count();
    assert!(white > 20 && white < 66 * 50 / 2, "{white} pixels painted");
    set(c, "prompt", "a red fox in the snow").await;
    set(c, "steps", "2").await;
    set(c, "strength", "0.75").await;
    click(c, "#random-seed").await;
    set(c, "seed", "3").await;
    screenshot(c, "inpainting").await;
    click(c, "#generate").await;
    assert_eq!(ended(c, Duration::from_secs(120)).await, "done");
    let shown = pixels_of(&result_src(c).await, &dir, "page.png");
    let (init, mask) = (init.to_str().unwrap(), dir.join("mask.png"));
    let made = gen_pixels(&dir, &["--prompt", "a red fox in the snow", "--init-image", init, "--mask", mask.to_str().unwrap(), "--strength", "0.75", "--steps", "2", "--seed", "3"]);
    assert!(shown.rgb == made, "the page's inpainting differs from gen --mask with the painted mask");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_job_is_cancelled_from_the_page() {
    let Some(b) = browser(1280, 1000).await else { return };
    let c = &b.client;
    let server = Server::start(&["--max-steps", "1000"]);
    open(c, &server).await;
    set(c, "prompt", "a long one").await;
    for (id, value) in [("width", "64"), ("height", "64"), ("steps", "1000")] {
        set(c, id, value).await;
    }
    click(c, "#generate").await;
    let started = Instant::now();
    while !text(c, "status").await.starts_with("step ") {
        assert!(started.elapsed() < Duration::from_secs(60), "never ran: {}", text(c, "status").await);
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    click(c, "#cancel").await;
    assert_eq!(ended(c, Duration::from_secs(60)).await, "cancelled");
    screenshot(c, "cancelled").await;
    assert!(server.log().contains("cancelled"), "{}", server.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_request_shows_its_reason_beside_its_field() {
    let Some(b) = browser(1280, 1000).await else { return };
    let c = &b.client;
    let server = Server::start(&[]);
    open(c, &server).await;
    set(c, "prompt", "a fox").await;
    set(c, "width", "30").await;
    set(c, "height", "32").await;
    click(c, "#generate").await;
    assert_eq!(ended(c, Duration::from_secs(60)).await, "refused");
    let said = text(c, "err-width").await;
    assert!(said.contains("width 30") && said.contains("multiple of 4"), "{said}");
    assert_eq!(script(c, "return document.getElementById('width').classList.contains('invalid')").await, true);
    assert_eq!(text(c, "err-general").await, "");
    screenshot(c, "refused").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_asks_for_the_api_key_once_and_reads_at_a_phones_width() {
    let Some(b) = browser(390, 844).await else { return };
    let c = &b.client;
    let server = Server::start(&["--api-key", "s3cret"]);
    c.goto(&server.url).await.unwrap();
    c.wait().at_most(Duration::from_secs(30)).for_element(Locator::Css("#key-dialog[open]")).await.unwrap();
    set(c, "api-key", "s3cret").await;
    click(c, "#key-form button").await;
    c.wait().at_most(Duration::from_secs(30)).for_element(Locator::Css("body[data-ready=yes]")).await.unwrap();
    assert!(text(c, "model-line").await.contains("tiny-a"));
    // Kept: a reload does not ask again.
    open(c, &server).await;
    assert!(c.find(Locator::Css("#key-dialog[open]")).await.is_err(), "asked for the key again");
    // Nothing wider than the phone's screen.
    assert_eq!(script(c, "return document.documentElement.scrollWidth <= window.innerWidth").await, true);
    screenshot(c, "phone").await;
}
