//! What several of the CLI's test files share.

use flux_lite_tests::model_dir;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// `flux-lite gen` on tiny model `model` with `args`, quietly, on the f32
/// tier (the one the diffusers goldens hold to exactly), writing `out`.
#[allow(dead_code)] // each test file that includes this module uses its part
pub fn gen_f32(model: &str, args: &[&str], out: &Path) -> Output {
    gen_on("f32", model, args, out)
}

/// [`gen_f32`] on precision tier `tier`.
pub fn gen_on(tier: &str, model: &str, args: &[&str], out: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flux-lite"))
        .args(["gen", "--model"])
        .arg(model_dir(model))
        .args(args)
        .args(["--quiet", "--precision", tier, "--output"])
        .arg(out)
        .output()
        .unwrap()
}

/// A running server, killed when dropped; its stderr collected.
#[allow(dead_code)] // each test file that includes this module uses its part
pub struct Server {
    pub child: Child,
    pub url: String,
    log: Arc<Mutex<String>>,
}

#[allow(dead_code)]
impl Server {
    pub fn start(extra: &[&str]) -> Self {
        Self::start_model("tiny-a", extra)
    }

    pub fn start_model(model: &str, extra: &[&str]) -> Self {
        let model = model_dir(model);
        let mut child = Command::new(env!("CARGO_BIN_EXE_flux-lite"))
            .args(["serve", "--model", model.to_str().unwrap(), "--port", "0", "--precision", "f32"])
            .args(extra)
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        let sink = log.clone();
        // Drained all along: a full pipe would stall the server.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(url) = line.strip_prefix("listening on ") {
                    let _ = tx.send(url.to_string());
                }
                sink.lock().unwrap().push_str(&format!("{line}\n"));
            }
        });
        let url = rx.recv_timeout(Duration::from_secs(120)).unwrap_or_else(|_| panic!("the server did not start: {}", log.lock().unwrap()));
        Self { child, url, log }
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

