//! `flux-lite serve` on loopback, driven by a real HTTP client: both APIs
//! return the diffusers golden image for the golden request (the same pixels
//! as `gen`), bad requests get a one-line JSON 4xx and the server goes on, a
//! burst beyond the queue gets 503 for the excess and the right image for
//! each seed of the rest, jobs can be watched and cancelled, the API key is
//! enforced, and SIGTERM stops the server cleanly.

#![allow(clippy::unwrap_used)]

mod support;

use base64::Engine;
use flux_lite_tests::{model_dir, read_png, scratch_dir, Goldens};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use support::Server;

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder().http_status_as_error(false).build().into()
}

/// `(status, body)` of a request with an optional JSON body and headers.
fn call(method: &str, url: &str, body: Option<&str>, headers: &[(&str, &str)]) -> (u16, String) {
    let agent = agent();
    let mut response = match (method, body) {
        ("GET", _) => headers.iter().fold(agent.get(url), |r, (k, v)| r.header(*k, *v)).call(),
        ("DELETE", _) => headers.iter().fold(agent.delete(url), |r, (k, v)| r.header(*k, *v)).call(),
        (_, body) => headers.iter().fold(agent.post(url), |r, (k, v)| r.header(*k, *v)).header("content-type", "application/json").send(body.unwrap_or("")),
    }
    .unwrap_or_else(|e| panic!("{method} {url}: {e}"));
    let status = response.status().as_u16();
    let text = response.body_mut().with_config().limit(64 << 20).read_to_string().unwrap();
    (status, text)
}

fn post(server: &Server, path: &str, body: &str) -> (u16, String) {
    call("POST", &format!("{}{path}", server.url), Some(body), &[])
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// The RGB of a base64 PNG.
fn rgb_of(b64: &str, dir: &Path, name: &str) -> flux_lite_tests::Png {
    let bytes = base64::engine::general_purpose::STANDARD.decode(b64).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    read_png(&path)
}

/// `gen`'s PNG for tiny-a at `size` with `steps`, `seed` and `prompt`.
fn gen_png(dir: &Path, prompt: &str, size: (usize, usize), steps: usize, seed: u64) -> flux_lite_tests::Png {
    let out = dir.join(format!("gen-{seed}-{steps}.png"));
    let model = model_dir("tiny-a");
    let (w, h, steps, seed) = (size.0.to_string(), size.1.to_string(), steps.to_string(), seed.to_string());
    let run = Command::new(env!("CARGO_BIN_EXE_flux-lite"))
        .args(["gen", "--model", model.to_str().unwrap(), "--prompt", prompt, "--width", &w, "--height", &h, "--steps", &steps, "--seed", &seed])
        .args(["--precision", "f32", "--quiet", "--output", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    read_png(&out)
}

fn golden_case(case: &str) -> (String, u64, usize, (usize, usize), flux_lite_tests::Png) {
    let c = Goldens::load(case).case_json();
    let n = |k: &str| c[k].as_u64().unwrap();
    let png = read_png(&Goldens::dir(case).join("image.png"));
    (c["prompt"].as_str().unwrap().to_string(), n("seed"), n("steps") as usize, (n("width") as usize, n("height") as usize), png)
}

#[test]
fn both_apis_return_the_golden_image_with_the_pixels_gen_makes() {
    let dir = scratch_dir("serve-golden");
    let server = Server::start(&[]);
    // OpenAI: the four-step case at the distilled model's default of 4 steps.
    let (prompt, seed, steps, (w, h), golden) = golden_case("tiny-a/four-step-wide");
    assert_eq!(steps, 4);
    let body = serde_json::json!({ "model": "flux", "prompt": prompt, "n": 1, "size": format!("{w}x{h}"), "seed": seed, "response_format": "b64_json" });
    let (status, text) = post(&server, "/v1/images/generations", &body.to_string());
    assert_eq!(status, 200, "{text}");
    let reply = json(&text);
    let png = rgb_of(reply["data"][0]["b64_json"].as_str().unwrap(), &dir, "openai.png");
    flux_lite_tests::tolerance::assert_png_close("OpenAI API against diffusers", &png.rgb, &golden.rgb);
    assert!(png.rgb == gen_png(&dir, &prompt, (w, h), steps, seed).rgb, "the OpenAI API's pixels differ from gen's");
    assert_eq!(reply["data"][0]["seed"], seed);
    // output_format: WebP is lossless (the PNG's pixels), JPEG at output_compression's quality.
    for (format, compression, status) in [("webp", None, 200), ("jpeg", Some(80), 200), ("gif", None, 400), ("webp", Some(50), 400), ("png", Some(80), 400)] {
        let mut body = body.clone();
        body["output_format"] = format.into();
        if let Some(c) = compression {
            body["output_compression"] = c.into();
        }
        let (got, text) = post(&server, "/v1/images/generations", &body.to_string());
        assert_eq!(got, status, "{format} {compression:?}: {text}");
        if status != 200 {
            assert!(text.contains("output_"), "{text}");
            continue;
        }
        let reply = json(&text);
        assert_eq!(reply["output_format"], format);
        let bytes = base64::engine::general_purpose::STANDARD.decode(reply["data"][0]["b64_json"].as_str().unwrap()).unwrap();
        let decoded = image::load_from_memory(&bytes).unwrap().to_rgb8().into_raw();
        match format {
            "webp" => assert!(decoded == png.rgb, "the WebP's pixels differ from the PNG's"),
            _ => assert_eq!(decoded.len(), png.rgb.len()),
        }
    }

    // AUTOMATIC1111: the one-step case.
    let (prompt, seed, steps, (w, h), golden) = golden_case("tiny-a/one-step");
    let body = serde_json::json!({ "prompt": prompt, "negative_prompt": "", "width": w, "height": h, "steps": steps, "seed": seed, "cfg_scale": 1.0, "batch_size": 1, "sampler_name": "Euler" });
    let (status, text) = post(&server, "/sdapi/v1/txt2img", &body.to_string());
    assert_eq!(status, 200, "{text}");
    let reply = json(&text);
    let png = rgb_of(reply["images"][0].as_str().unwrap(), &dir, "a1111.png");
    flux_lite_tests::tolerance::assert_png_close("AUTOMATIC1111 API against diffusers", &png.rgb, &golden.rgb);
    assert!(png.rgb == gen_png(&dir, &prompt, (w, h), steps, seed).rgb, "the A1111 API's pixels differ from gen's");
    let info = json(reply["info"].as_str().unwrap());
    assert_eq!(info["all_seeds"], serde_json::json!([seed]));
    assert_eq!(png.text.iter().find(|(k, _)| k == "seed").map(|(_, v)| v.clone()), Some(seed.to_string()));
    // A1111's `infotexts`: each image's `parameters`, as its PNG carries them.
    let parameters = png.text.iter().find(|(k, _)| k == "parameters").map(|(_, v)| v.clone()).unwrap();
    assert_eq!(info["infotexts"], serde_json::json!([parameters]));
    assert!(parameters.starts_with(&format!("{prompt}\nSteps: {steps}, Sampler: Euler, ")) && parameters.contains(&format!("Seed: {seed}, Size: {w}x{h}")), "{parameters}");
}

#[test]
fn a_negative_prompt_steers_both_apis_as_the_diffusers_golden() {
    let dir = scratch_dir("serve-negative");
    let server = Server::start_model("tiny-b", &[]);
    let (prompt, seed, steps, (w, h), golden) = golden_case("tiny-b/cfg-negative");
    let negative = Goldens::load("tiny-b/cfg-negative").case_json()["negative_prompt"].as_str().unwrap().to_string();
    let body = serde_json::json!({ "prompt": prompt, "negative_prompt": negative, "width": w, "height": h, "steps": steps, "seed": seed, "cfg_scale": 4.0 });
    let (status, text) = post(&server, "/sdapi/v1/txt2img", &body.to_string());
    assert_eq!(status, 200, "{text}");
    let reply = json(&text);
    let png = rgb_of(reply["images"][0].as_str().unwrap(), &dir, "a1111.png");
    flux_lite_tests::tolerance::assert_png_close("A1111's negative_prompt against diffusers", &png.rgb, &golden.rgb);
    let info = json(reply["info"].as_str().unwrap());
    assert_eq!(info["negative_prompt"], negative.as_str());
    let infotext = info["infotexts"][0].as_str().unwrap();
    assert!(infotext.starts_with(&format!("{prompt}\nNegative prompt: {negative}\nSteps: {steps}, ")), "{infotext}");
    // OpenAI's shape takes it as an extension, as it takes the seed and the guidance.
    let body = serde_json::json!({ "prompt": prompt, "negative_prompt": negative, "size": format!("{w}x{h}"), "steps": steps, "seed": seed, "guidance": 4.0 });
    let (status, text) = post(&server, "/v1/images/generations", &body.to_string());
    assert_eq!(status, 200, "{text}");
    let openai = rgb_of(json(&text)["data"][0]["b64_json"].as_str().unwrap(), &dir, "openai.png");
    assert!(openai.rgb == png.rgb, "the two APIs' pixels differ for one request");

    // png-info reads the settings back as A1111 answers: the infotext, its fields, the other chunks.
    let body = serde_json::json!({ "image": format!("data:image/png;base64,{}", reply["images"][0].as_str().unwrap()) });
    let (status, text) = post(&server, "/sdapi/v1/png-info", &body.to_string());
    assert_eq!(status, 200, "{text}");
    let read = json(&text);
    assert_eq!(read["info"], infotext);
    assert_eq!(read["parameters"]["Negative prompt"], negative.as_str());
    assert_eq!(read["parameters"]["Seed"], seed.to_string());
    assert_eq!((read["parameters"]["Size-1"].as_u64(), read["parameters"]["Size-2"].as_u64()), (Some(w as u64), Some(h as u64)));
    let recipe = json(read["items"]["flux-lite"].as_str().unwrap());
    assert_eq!((recipe["seed"].as_u64(), recipe["negative_prompt"].as_str(), recipe["precision"].as_str()), (Some(seed), Some(negative.as_str()), Some("f32")));
    assert!(recipe["model"]["weights"].as_str().unwrap().starts_with("sha256:"), "{recipe}");
    // The server's image made again from itself by gen, pixel for pixel.
    let again = dir.join("again.png");
    let run = Command::new(env!("CARGO_BIN_EXE_flux-lite")).args(["gen", "--quiet", "--from", dir.join("a1111.png").to_str().unwrap(), "--output", again.to_str().unwrap()]).output().unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    assert!(read_png(&again).rgb == png.rgb, "gen --from the server's image made other pixels");
    let (status, text) = post(&server, "/sdapi/v1/png-info", r#"{"image": "aGk="}"#);
    assert!(status == 400 && text.contains("image: not a PNG, JPEG or WebP file"), "{status} {text}");
}

#[test]
fn reference_images_init_images_and_masks_come_as_base64_through_both_apis() {
    let dir = scratch_dir("serve-references");
    let server = Server::start(&[]);
    let b64 = |path: &std::path::Path| base64::engine::general_purpose::STANDARD.encode(std::fs::read(path).unwrap());
    // OpenAI's edits without a mask: the images are references (as gen --image), one as a data URL.
    let case = "tiny-a/reference-one";
    let (prompt, seed, steps, _, golden) = golden_case(case);
    let reference = Goldens::dir(case).join("ref0.png");
    let body = serde_json::json!({ "prompt": prompt, "steps": steps, "seed": seed, "images": [{ "image_url": format!("data:image/png;base64,{}", b64(&reference)) }] });
    let (status, text) = post(&server, "/v1/images/edits", &body.to_string());
    assert_eq!(status, 200, "{text}");
    let openai = rgb_of(json(&text)["data"][0]["b64_json"].as_str().unwrap(), &dir, "edits.png");
    flux_lite_tests::tolerance::assert_png_close("edits with a reference against diffusers", &openai.rgb, &golden.rgb);
    let out = dir.join("gen.png");
    let model = model_dir("tiny-a");
    let run = Command::new(env!("CARGO_BIN_EXE_flux-lite"))
        .args(["gen", "--model", model.to_str().unwrap(), "--prompt", &prompt, "--steps", &steps.to_string(), "--seed", &seed.to_string()])
        .args(["--image", reference.to_str().unwrap(), "--precision", "f32", "--quiet", "--output", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    assert!(read_png(&out).rgb == openai.rgb, "the server's pixels differ from gen's for the same reference");

    // AUTOMATIC1111's img2img: the first init image is the picture to change, the others references.
    let case = "tiny-a/img2img-reference";
    let (prompt, seed, steps, _, golden) = golden_case(case);
    let c = Goldens::load(case).case_json();
    let files = Goldens::dir(case);
    let body = serde_json::json!({ "prompt": prompt, "steps": steps, "seed": seed, "denoising_strength": c["strength"],
        "init_images": [b64(&files.join("init.png")), b64(&files.join("ref0.png"))] });
    let (status, text) = post(&server, "/sdapi/v1/img2img", &body.to_string());
    assert_eq!(status, 200, "{text}");
    let a1111 = rgb_of(json(&text)["images"][0].as_str().unwrap(), &dir, "img2img.png");
    flux_lite_tests::tolerance::assert_png_close("img2img against diffusers", &a1111.rgb, &golden.rgb);

    // Inpainting: AUTOMATIC1111's white-repaints mask, and OpenAI's transparent-repaints one.
    let case = "tiny-a/inpaint-blob";
    let (prompt, seed, steps, _, golden) = golden_case(case);
    let c = Goldens::load(case).case_json();
    let files = Goldens::dir(case);
    let body = serde_json::json!({ "prompt": prompt, "steps": steps, "seed": seed, "denoising_strength": c["strength"], "mask_blur": 0,
        "init_images": [b64(&files.join("init.png"))], "mask": b64(&files.join("mask.png")) });
    let (status, text) = post(&server, "/sdapi/v1/img2img", &body.to_string());
    assert_eq!(status, 200, "{text}");
    let a1111 = rgb_of(json(&text)["images"][0].as_str().unwrap(), &dir, "inpaint-a1111.png");
    flux_lite_tests::tolerance::assert_png_close("A1111 inpainting against diffusers", &a1111.rgb, &golden.rgb);
    // The same mask as OpenAI draws it: opaque where kept, transparent where repainted.
    let grey = image::open(files.join("mask.png")).unwrap().to_luma8();
    let alpha = image::RgbaImage::from_fn(grey.width(), grey.height(), |x, y| image::Rgba([0, 0, 0, 255 - grey.get_pixel(x, y)[0]]));
    let alpha_png = dir.join("alpha-mask.png");
    alpha.save(&alpha_png).unwrap();
    let body = serde_json::json!({ "prompt": prompt, "steps": steps, "seed": seed, "strength": c["strength"],
        "image": b64(&files.join("init.png")), "mask": b64(&alpha_png) });
    let (status, text) = post(&server, "/v1/images/edits", &body.to_string());
    assert_eq!(status, 200, "{text}");
    let openai = rgb_of(json(&text)["data"][0]["b64_json"].as_str().unwrap(), &dir, "inpaint-openai.png");
    assert!(openai.rgb == a1111.rgb, "the two APIs' inpainting pixels differ for the same mask");
    // "Only masked" (inpaint_full_res) is diffusers' padding_mask_crop: the masked-crop golden.
    let case = "tiny-a/inpaint-crop";
    let (prompt_crop, seed, steps, _, golden) = golden_case(case);
    let c = Goldens::load(case).case_json();
    let files = Goldens::dir(case);
    let body = serde_json::json!({ "prompt": prompt_crop, "steps": steps, "seed": seed, "denoising_strength": c["strength"],
        "inpaint_full_res": true, "inpaint_full_res_padding": c["mask_crop"],
        "init_images": [b64(&files.join("init.png"))], "mask": b64(&files.join("mask.png")) });
    let (status, text) = post(&server, "/sdapi/v1/img2img", &body.to_string());
    assert_eq!(status, 200, "{text}");
    let cropped = rgb_of(json(&text)["images"][0].as_str().unwrap(), &dir, "inpaint-crop.png");
    assert_eq!((cropped.width, cropped.height), (golden.width, golden.height), "the result has the init image's size");
    flux_lite_tests::tolerance::assert_png_close("A1111 only-masked inpainting against diffusers' padding_mask_crop", &cropped.rgb, &golden.rgb);
    // Fields with no diffusers equivalent are refused when set otherwise, one line each.
    for (field, value) in [("mask_blur", serde_json::json!(4)), ("inpaint_full_res", serde_json::json!(true)), ("inpainting_fill", serde_json::json!(0))] {
        let mut body = serde_json::json!({ "prompt": prompt, "init_images": [b64(&files.join("init.png"))] });
        body[field] = value;
        let (status, text) = post(&server, "/sdapi/v1/img2img", &body.to_string());
        assert_eq!(status, 400, "{field}: {text}");
        assert!(json(&text)["error"]["message"].as_str().unwrap().starts_with(field), "{text}");
    }
    let (status, text) = post(&server, "/v1/images/edits", &serde_json::json!({ "prompt": prompt, "image": b64(&files.join("init.png")), "mask": b64(&files.join("mask.png")) }).to_string());
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("no alpha channel"), "{text}");
    // Each of those images keeps the images its request sent: gen makes it again from it alone.
    for name in ["edits.png", "img2img.png", "inpaint-a1111.png", "inpaint-openai.png", "inpaint-crop.png"] {
        let (made, again) = (dir.join(name), dir.join(format!("again-{name}")));
        let run = Command::new(env!("CARGO_BIN_EXE_flux-lite")).args(["gen", "--quiet", "--from", made.to_str().unwrap(), "--output", again.to_str().unwrap()]).output().unwrap();
        assert!(run.status.success(), "{name}: {}", String::from_utf8_lossy(&run.stderr));
        assert!(read_png(&again).rgb == read_png(&made).rgb, "{name}: made again from itself, other pixels");
    }
}

#[test]
fn bad_requests_get_a_one_line_json_4xx_and_the_server_keeps_serving() {
    let server = Server::start(&["--max-body-mib", "1", "--max-images", "4", "--max-steps", "8"]);
    let cases: Vec<(&str, String, u16, &str)> = vec![
        ("/v1/images/generations", "{not json".into(), 400, "not the JSON expected"),
        ("/v1/images/generations", r#"{"prompt": 5}"#.into(), 400, "invalid type"),
        ("/v1/images/generations", r#"{"prompt": "x", "n": "two"}"#.into(), 400, "invalid type"),
        ("/v1/images/generations", r#"{"size": "32x32"}"#.into(), 400, "missing field `prompt`"),
        ("/v1/images/generations", r#"{"prompt": "x", "size": "30x32"}"#.into(), 400, "size 30x32"),
        ("/v1/images/generations", r#"{"prompt": "x", "size": "huge"}"#.into(), 400, "WIDTHxHEIGHT"),
        ("/v1/images/generations", r#"{"prompt": "x", "size": "32x32", "n": 5}"#.into(), 400, "give 1 to 4"),
        ("/v1/images/generations", r#"{"prompt": "x", "size": "32x32", "response_format": "url"}"#.into(), 400, "b64_json"),
        ("/v1/images/generations", r#"{"prompt": "x", "size": "32x32", "image": "@@@"}"#.into(), 400, "image[0]: not base64"),
        ("/v1/images/generations", r#"{"prompt": "x", "size": "32x32", "image": "aGVsbG8="}"#.into(), 400, "image[0]: not a PNG or JPEG"),
        ("/sdapi/v1/txt2img", r#"{"prompt": "x", "width": 32, "height": 32, "steps": 9}"#.into(), 400, "steps 9"),
        ("/sdapi/v1/txt2img", r#"{"prompt": "x", "width": 32, "height": 32, "seed": -5}"#.into(), 400, "seed -5"),
        ("/sdapi/v1/txt2img", r#"{"prompt": "x", "width": 32, "height": 32, "batch_size": 0}"#.into(), 400, "0 images"),
        ("/sdapi/v1/txt2img", r#"{"prompt": "x", "width": 8192, "height": 32}"#.into(), 400, "at most 4096"),
        ("/nowhere", "{}".into(), 404, "no such endpoint"),
    ];
    for (path, body, want, says) in &cases {
        let (status, text) = post(&server, path, body);
        assert_eq!(status, *want, "{path} {}: {text}", &body[..body.len().min(60)]);
        assert!(!text.contains('\n'), "one line: {text}");
        let message = json(&text)["error"]["message"].as_str().unwrap_or_else(|| panic!("no error.message: {text}")).to_string();
        assert!(message.contains(says), "{path}: {message:?} should say {says:?}");
    }
    let (status, text) = declare_a_huge_body(&server, 2 << 20);
    assert_eq!(status, 413, "{text}");
    assert!(json(&text)["error"]["message"].as_str().unwrap().contains("request body"), "{text}");
    let (status, text) = call("GET", &format!("{}/v1/images/generations", server.url), None, &[]);
    assert_eq!(status, 405, "{text}");
    assert!(json(&text)["error"]["message"].is_string());
    // Still serving, and nothing was queued by the bad requests.
    let (status, text) = post(&server, "/v1/images/generations", r#"{"prompt": "a red fox in the snow", "size": "32x32", "steps": 1, "seed": 3}"#);
    assert_eq!(status, 200, "{text}");
    let (_, jobs) = call("GET", &format!("{}/v1/jobs", server.url), None, &[]);
    assert_eq!(json(&jobs)["jobs"].as_array().unwrap().len(), 1, "{jobs}");
    assert!(!server.log().contains("panicked"), "{}", server.log());
}

#[test]
fn a_burst_beyond_the_queue_gets_503_for_the_excess_and_each_seeds_image_for_the_rest() {
    let dir = scratch_dir("serve-burst");
    const BURST: u64 = 6;
    // The expected images: one batch of the same seeds (a batch's images are its single runs'),
    // in one step: the burst is about the queue and which image each request gets.
    let model = model_dir("tiny-a");
    let out = dir.join("want.png");
    let run = Command::new(env!("CARGO_BIN_EXE_flux-lite"))
        .args(["gen", "--model", model.to_str().unwrap(), "--prompt", "a red fox in the snow", "--width", "32", "--height", "32", "--steps", "1"])
        .args(["--seed", "100", "--count", &BURST.to_string(), "--precision", "f32", "--quiet", "--output", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let server = Server::start(&["--queue", "1"]);
    let url = format!("{}/sdapi/v1/txt2img", server.url);
    let threads: Vec<_> = (0..BURST)
        .map(|i| {
            let url = url.clone();
            std::thread::spawn(move || {
                let body = serde_json::json!({ "prompt": "a red fox in the snow", "width": 32, "height": 32, "steps": 1, "seed": 100 + i });
                (i, call("POST", &url, Some(&body.to_string()), &[]))
            })
        })
        .collect();
    let (mut served, mut refused) = (0, 0);
    for t in threads {
        let (i, (status, text)) = t.join().unwrap();
        match status {
            200 => {
                let reply = json(&text);
                assert_eq!(json(reply["info"].as_str().unwrap())["seed"], 100 + i, "request {i} got another request's image");
                let got = rgb_of(reply["images"][0].as_str().unwrap(), &dir, &format!("got-{i}.png"));
                let want = read_png(&dir.join(format!("want-{:04}.png", i + 1)));
                assert!(got.rgb == want.rgb, "request {i} (seed {}): not the image of its seed", 100 + i);
                served += 1;
            }
            503 => {
                assert!(json(&text)["error"]["message"].as_str().unwrap().contains("queue is full"), "{text}");
                refused += 1;
            }
            other => panic!("request {i}: {other} {text}"),
        }
    }
    eprintln!("burst of {BURST}: {served} served, {refused} refused");
    assert!(served >= 1 && refused >= 1 && served + refused == BURST, "{served} served, {refused} refused");
    // The queue is free again.
    let body = serde_json::json!({ "prompt": "a red fox in the snow", "width": 32, "height": 32, "steps": 1, "seed": 100 });
    let (status, text) = call("POST", &url, Some(&body.to_string()), &[]);
    assert_eq!(status, 200, "{text}");
}

/// A POST whose header declares `bytes` of body, of which only the start is
/// sent: the server answers from the header alone (a client that went on
/// writing would meet a closed connection).
fn declare_a_huge_body(server: &Server, bytes: usize) -> (u16, String) {
    use std::io::{Read, Write};
    let address = server.url.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let head = format!("POST /v1/images/generations HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {bytes}\r\nConnection: close\r\n\r\n{{\"prompt\": \"");
    stream.write_all(head.as_bytes()).unwrap();
    let mut reply = String::new();
    let _ = stream.read_to_string(&mut reply);
    let status = reply.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("no status line: {reply:?}"));
    let body = reply.split_once("\r\n\r\n").map_or(String::new(), |(_, b)| b.to_string());
    (status, body)
}

/// Polls `GET /v1/jobs/{id}` until `status` (or panics after a minute).
fn wait_for(server: &Server, id: &str, status: &str) -> serde_json::Value {
    let started = Instant::now();
    loop {
        let (code, text) = call("GET", &format!("{}/v1/jobs/{id}", server.url), None, &[]);
        if code == 200 && json(&text)["status"] == status {
            return json(&text);
        }
        assert!(started.elapsed() < Duration::from_secs(60), "job {id} never became {status}: {code} {text}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_running_job_can_be_watched_and_cancelled_and_the_server_goes_on() {
    let server = Server::start(&["--max-steps", "200"]);
    let url = format!("{}/v1/images/generations", server.url);
    let long = std::thread::spawn(move || {
        let body = r#"{"prompt": "a red fox in the snow", "size": "32x32", "steps": 200, "seed": 1}"#;
        call("POST", &url, Some(body), &[("X-Job-Id", "long-one")])
    });
    wait_for(&server, "long-one", "running");
    let (_, progress) = call("GET", &format!("{}/sdapi/v1/progress", server.url), None, &[]);
    let progress = json(&progress);
    assert_eq!(progress["state"]["job"], "long-one", "{progress}");
    assert_eq!(progress["state"]["sampling_steps"], 200);
    // Once a step is done, the progress carries the preview of the image forming.
    let started = Instant::now();
    let preview = loop {
        let (_, text) = call("GET", &format!("{}/sdapi/v1/progress", server.url), None, &[]);
        if let Some(image) = json(&text)["current_image"].as_str() {
            break image.to_string();
        }
        assert!(started.elapsed() < Duration::from_secs(60), "no current_image while long-one ran: {text}");
        std::thread::sleep(Duration::from_millis(20));
    };
    let dir = std::env::temp_dir().join(format!("flux-lite-serve-preview-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let png = rgb_of(&preview, &dir, "preview.png");
    assert_eq!((png.width, png.height), (32, 32));
    std::fs::remove_dir_all(&dir).unwrap();
    let (status, text) = call("DELETE", &format!("{}/v1/jobs/long-one", server.url), None, &[]);
    assert_eq!(status, 200, "{text}");
    let (status, text) = long.join().unwrap();
    assert_eq!(status, 409, "{text}");
    assert!(text.contains("long-one was cancelled"), "{text}");
    assert_eq!(wait_for(&server, "long-one", "cancelled")["steps"], 200);
    let (status, text) = call("DELETE", &format!("{}/v1/jobs/long-one", server.url), None, &[]);
    assert_eq!(status, 409, "a finished job cannot be cancelled: {text}");
    let (status, text) = post(&server, "/v1/images/generations", r#"{"prompt": "a red fox in the snow", "size": "32x32", "steps": 1, "seed": 2}"#);
    assert_eq!(status, 200, "the server goes on after a cancel: {text}");
}

#[test]
fn with_an_api_key_only_health_answers_without_it() {
    let server = Server::start(&["--api-key", "s3cret"]);
    assert_eq!(call("GET", &format!("{}/health", server.url), None, &[]).0, 200);
    let (status, text) = call("GET", &format!("{}/v1/models", server.url), None, &[]);
    assert_eq!(status, 401, "{text}");
    assert_eq!(call("GET", &format!("{}/v1/models", server.url), None, &[("Authorization", "Bearer wrong")]).0, 401);
    let (status, text) = call("GET", &format!("{}/v1/models", server.url), None, &[("Authorization", "Bearer s3cret")]);
    assert_eq!(status, 200, "{text}");
    assert!(json(&text)["data"][0]["id"].as_str().unwrap().contains("tiny-a"));
}

/// A request written by hand (a browser's headers, any `Host`): the status and the whole answer.
fn raw(server: &Server, method: &str, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    use std::io::{Read, Write};
    let address = server.url.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    let mut request = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        request.push_str(&format!("Host: {address}\r\n"));
    }
    for (k, v) in headers {
        request.push_str(&format!("{k}: {v}\r\n"));
    }
    request.push_str("Content-Length: 0\r\n\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status = answer.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("no status in {answer:?}"));
    (status, answer)
}

#[test]
fn pages_of_other_sites_and_foreign_host_names_are_refused() {
    let server = Server::start(&["--allow-origin", "http://localhost:3000"]);
    let own = server.url.clone();
    // The server's own page, and programs that send no Origin, are served.
    assert_eq!(raw(&server, "GET", "/health", &[("Origin", &own)]).0, 200);
    assert_eq!(raw(&server, "GET", "/health", &[]).0, 200);
    // Another site's page is refused, naming the flag that would let it in.
    let (status, answer) = raw(&server, "POST", "/sdapi/v1/interrupt", &[("Origin", "http://evil.example")]);
    assert!(status == 403 && answer.contains("--allow-origin http://evil.example"), "{answer}");
    // A name that only resolves here (DNS rebinding) is not this server's.
    let (status, answer) = raw(&server, "GET", "/v1/models", &[("Host", "evil.example:7860")]);
    assert!(status == 421 && answer.contains("--allow-host evil.example"), "{answer}");
    assert_eq!(raw(&server, "GET", "/health", &[("Host", "localhost")]).0, 200);
    // An origin allowed: its preflight is answered and its answers carry CORS headers.
    let (status, answer) = raw(&server, "OPTIONS", "/v1/images/generations", &[("Origin", "http://localhost:3000"), ("Access-Control-Request-Method", "POST")]);
    let lower = answer.to_ascii_lowercase();
    assert!(status == 204 && lower.contains("access-control-allow-origin: http://localhost:3000") && lower.contains("access-control-allow-methods"), "{answer}");
    let (status, answer) = raw(&server, "GET", "/v1/models", &[("Origin", "http://localhost:3000")]);
    assert!(status == 200 && answer.to_ascii_lowercase().contains("access-control-allow-origin: http://localhost:3000"), "{answer}");
    // The server went on.
    assert_eq!(call("GET", &format!("{}/health", server.url), None, &[]).0, 200);
}

#[test]
fn metrics_count_jobs_steps_and_memory_for_an_operator() {
    let server = Server::start(&["--api-key", "s3cret"]);
    let key = [("Authorization", "Bearer s3cret")];
    // Behind the key unless --metrics-public.
    assert_eq!(call("GET", &format!("{}/metrics", server.url), None, &[]).0, 401);
    let body = serde_json::json!({ "prompt": "a fox", "size": "32x32", "steps": 2, "seed": 1 });
    let (status, text) = call("POST", &format!("{}/v1/images/generations", server.url), Some(&body.to_string()), &key);
    assert_eq!(status, 200, "{text}");
    let (status, text) = call("GET", &format!("{}/metrics", server.url), None, &key);
    assert_eq!(status, 200, "{text}");
    let value = |name: &str| -> f64 {
        let line = text.lines().find(|l| l.starts_with(name) && l[name.len()..].starts_with(' ')).unwrap_or_else(|| panic!("no {name} in\n{text}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert_eq!(value("flux_lite_jobs_total{outcome=\"done\"}"), 1.0);
    assert_eq!(value("flux_lite_jobs_total{outcome=\"failed\"}"), 0.0);
    assert_eq!(value("flux_lite_step_seconds_count"), 2.0);
    assert!(value("flux_lite_step_seconds_sum") > 0.0);
    assert_eq!(value("flux_lite_image_seconds_count"), 1.0);
    assert!(value("flux_lite_device_memory_planned_bytes") > 0.0 && value("flux_lite_device_memory_high_water_bytes") > 0.0);
    assert_eq!(value("flux_lite_queue_depth"), 0.0);
    assert!(text.lines().any(|l| l.starts_with("flux_lite_info{adapter=\"") && l.contains("tier=\"f32\",model=\"tiny-a\"} 1")), "{text}");
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        assert!(line.rsplit(' ').next().unwrap().parse::<f64>().is_ok(), "not a sample: {line}");
    }
    drop(server);
    let open = Server::start(&["--api-key", "s3cret", "--metrics-public"]);
    assert_eq!(call("GET", &format!("{}/metrics", open.url), None, &[]).0, 200);
    assert_eq!(call("GET", &format!("{}/v1/models", open.url), None, &[]).0, 401);
}

#[cfg(unix)]
#[test]
fn sigterm_stops_the_running_job_answers_it_and_exits_cleanly() {
    let mut server = Server::start(&["--max-steps", "500"]);
    let url = format!("{}/v1/images/generations", server.url);
    let long = std::thread::spawn(move || {
        let body = r#"{"prompt": "a red fox in the snow", "size": "32x32", "steps": 500, "seed": 1}"#;
        call("POST", &url, Some(body), &[("X-Job-Id", "stopped-by-term")])
    });
    wait_for(&server, "stopped-by-term", "running");
    let pid = server.child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let (status, text) = long.join().unwrap();
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("shutting down"), "{text}");
    let started = Instant::now();
    let exit = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "the server did not exit: {}", server.log());
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(exit.success(), "{exit:?}: {}", server.log());
    assert!(server.log().contains("stopped"), "{}", server.log());
}

/// `serve --preview-decoder`: the streamed partial images come from the
/// tiny decoder (they differ from the latent-to-RGB map's for the same
/// request); a file that is no decoder stops the server at start with one line.
#[test]
fn a_preview_decoder_draws_the_streamed_partial_images() {
    let decoder = flux_lite_tests::test_vectors().join("goldens/tiny_decoder/taesd.safetensors");
    let body = r#"{"prompt": "a red fox in the snow", "size": "32x32", "steps": 6, "seed": 5, "stream": true, "partial_images": 3}"#;
    let dir = std::env::temp_dir().join(format!("flux-lite-serve-tiny-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut partials = Vec::new();
    for (name, extra) in [("map", vec![]), ("tiny", vec!["--preview-decoder", decoder.to_str().unwrap()])] {
        let server = Server::start(&extra);
        let (status, text) = post(&server, "/v1/images/generations", body);
        assert_eq!(status, 200, "{text}");
        let images: Vec<Vec<u8>> = text
            .split("\n\n")
            .filter(|e| e.contains("event: image_generation.partial_image"))
            .enumerate()
            .map(|(i, e)| {
                let data = json(e.lines().find_map(|l| l.strip_prefix("data: ")).unwrap());
                let png = rgb_of(data["b64_json"].as_str().unwrap(), &dir, &format!("{name}-{i}.png"));
                assert_eq!((png.width, png.height), (32, 32));
                png.rgb
            })
            .collect();
        assert!(!images.is_empty(), "{name}: no partial image");
        partials.push(images);
    }
    assert!(partials[1].iter().all(|tiny| !partials[0].contains(tiny)), "a tiny decoder's partial image is the map's");
    let vae = flux_lite_tests::model_dir("tiny-a").join("vae/diffusion_pytorch_model.safetensors");
    let out = Command::new(env!("CARGO_BIN_EXE_flux-lite"))
        .args(["serve", "--model", flux_lite_tests::model_dir("tiny-a").to_str().unwrap(), "--port", "0", "--preview-decoder", vae.to_str().unwrap()])
        .output()
        .unwrap();
    let line = flux_lite_tests::only_an_error_line(&out);
    assert!(line.starts_with("error: --preview-decoder: ") && line.contains("not a tiny decoder"), "{line}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_streamed_generation_sends_partial_images_then_the_image() {
    let server = Server::start(&[]);
    let body = r#"{"prompt": "a red fox in the snow", "size": "32x32", "steps": 4, "seed": 5, "stream": true, "partial_images": 2}"#;
    let (status, text) = post(&server, "/v1/images/generations", body);
    assert_eq!(status, 200, "{text}");
    // Server-sent events: `event: KIND` then `data: JSON`, a blank line between.
    let events: Vec<(String, serde_json::Value)> = text
        .split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let kind = e.lines().find_map(|l| l.strip_prefix("event: ")).unwrap_or_else(|| panic!("no event line in {e}"));
            let data = e.lines().find_map(|l| l.strip_prefix("data: ")).unwrap_or_else(|| panic!("no data line in {e}"));
            (kind.to_string(), json(data))
        })
        .collect();
    let kinds: Vec<&str> = events.iter().map(|(k, _)| k.as_str()).collect();
    let partials = kinds.iter().filter(|k| **k == "image_generation.partial_image").count();
    assert!((1..=2).contains(&partials), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"image_generation.completed"), "{kinds:?}");
    assert_eq!(kinds.iter().filter(|k| **k == "image_generation.completed").count(), 1, "{kinds:?}");
    let dir = std::env::temp_dir().join(format!("flux-lite-serve-stream-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (i, (_, data)) in events.iter().enumerate() {
        let png = rgb_of(data["b64_json"].as_str().unwrap(), &dir, &format!("{i}.png"));
        assert_eq!((png.width, png.height), (32, 32));
    }
    // The streamed image is the one the unstreamed request makes.
    let (_, plain) = post(&server, "/v1/images/generations", r#"{"prompt": "a red fox in the snow", "size": "32x32", "steps": 4, "seed": 5}"#);
    let plain = rgb_of(json(&plain)["data"][0]["b64_json"].as_str().unwrap(), &dir, "plain.png");
    let streamed = rgb_of(events.last().unwrap().1["b64_json"].as_str().unwrap(), &dir, "streamed.png");
    assert_eq!(plain.rgb, streamed.rgb);
    std::fs::remove_dir_all(&dir).unwrap();
    // partial_images out of range, or without stream: one-line 400s.
    let (status, text) = post(&server, "/v1/images/generations", r#"{"prompt": "x", "stream": true, "partial_images": 4}"#);
    assert!(status == 400 && text.contains("partial_images 4: give 0 to 3"), "{status} {text}");
    let (status, text) = post(&server, "/v1/images/generations", r#"{"prompt": "x", "partial_images": 1}"#);
    assert!(status == 400 && text.contains("partial_images needs stream: true"), "{status} {text}");
}

/// `serve --kv-precision f32` holds every request to the exact path: under
/// a budget only f16 keys and values fit (tiny-a at 64×48 needs 5,101,056
/// bytes with them, 5,285,376 without), a request gets a 400 naming the
/// budget and the server goes on; the default takes f16 keys and answers.
#[test]
fn kv_precision_f32_refuses_what_only_f16_keys_fit() {
    let body = r#"{"prompt": "a red fox in the snow", "size": "64x48", "steps": 1, "seed": 7}"#;
    let exact = Server::start(&["--memory-budget", "5200000B", "--kv-precision", "f32"]);
    let (status, text) = post(&exact, "/v1/images/generations", body);
    assert_eq!(status, 400, "{text}");
    let message = json(&text)["error"]["message"].as_str().unwrap().to_string();
    assert!(message.contains("64x48") && message.contains("5285376"), "{message}");
    let (status, _) = call("GET", &format!("{}/health", exact.url), None, &[]);
    assert_eq!(status, 200);
    drop(exact);
    let auto = Server::start(&["--memory-budget", "5200000B"]);
    let (status, text) = post(&auto, "/v1/images/generations", body);
    assert_eq!(status, 200, "{text}");
    assert!(!auto.log().contains("panicked"), "{}", auto.log());
}
