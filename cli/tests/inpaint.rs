//! Inpainting and image-to-image (`gen --init-image FILE [--mask FILE]
//! [--strength S]`) against `Flux2KleinInpaintPipeline`'s PNGs (diffusers
//! 0.42.1, `test_vectors/generate_inpaint.py`), and their errors.

#![allow(clippy::unwrap_used)]

use flux_lite_tests::{read_png, scratch_dir, the_error_line, Goldens};

pub const INPAINT_CASES: [&str; 6] =
    ["tiny-a/inpaint-rect", "tiny-a/inpaint-blob", "tiny-a/img2img-reference", "tiny-a/inpaint-mask-rescaled", "tiny-b/inpaint-cfg", "tiny-a/inpaint-crop"];

mod support;
use support::gen_f32 as gen;

/// The flags of a golden case: its init image, its mask (none for the
/// all-white one: image-to-image), its reference, strength and steps, and
/// the masked crop's padding where it has one.
fn case_args(case: &str) -> (String, Vec<String>) {
    let dir = Goldens::dir(case);
    let c = Goldens::load(case).case_json();
    let file = |f: &str| dir.join(f).to_str().unwrap().to_string();
    let mut args: Vec<String> = ["--prompt", c["prompt"].as_str().unwrap()].map(String::from).to_vec();
    for key in ["seed", "steps", "guidance", "strength"] {
        args.extend([format!("--{key}"), c[key].to_string()]);
    }
    args.extend(["--init-image".into(), file("init.png")]);
    if c["mask"]["kind"] != "white" {
        args.extend(["--mask".into(), file("mask.png")]);
    }
    for r in c["references"].as_array().unwrap() {
        args.extend(["--image".into(), file(r.as_str().unwrap())]);
    }
    if let Some(pad) = c.get("mask_crop") {
        args.extend(["--mask-crop".into(), pad.to_string()]);
    }
    (c["model"].as_str().unwrap().to_string(), args)
}

#[test]
fn inpainting_and_image_to_image_make_the_diffusers_pngs() {
    let dir = scratch_dir("inpaint-goldens");
    for case in INPAINT_CASES {
        let (model, args) = case_args(case);
        let out = dir.join(format!("{}.png", case.replace('/', "-")));
        let run = gen(&model, &args.iter().map(String::as_str).collect::<Vec<_>>(), &out);
        assert!(run.status.success(), "{case}: {}", String::from_utf8_lossy(&run.stderr));
        let (got, want) = (read_png(&out), read_png(&Goldens::dir(case).join("image.png")));
        assert_eq!((got.width, got.height), (want.width, want.height), "{case}: the init image sets the size");
        let max = got.rgb.iter().zip(&want.rgb).map(|(a, b)| a.abs_diff(*b)).max().unwrap();
        let mean = got.rgb.iter().zip(&want.rgb).map(|(a, b)| a.abs_diff(*b) as f64).sum::<f64>() / want.rgb.len() as f64;
        eprintln!("{case}: max |Δ| {max}, mean {mean:.5}");
        flux_lite_tests::tolerance::assert_png_close(case, &got.rgb, &want.rgb);
    }
}

#[test]
fn bad_init_images_masks_and_strengths_are_one_error_line_and_no_file() {
    let dir = scratch_dir("inpaint-errors");
    let out = dir.join("never.png");
    let case = Goldens::dir("tiny-a/inpaint-rect");
    let (init, mask) = (case.join("init.png"), case.join("mask.png"));
    let (init, mask) = (init.to_str().unwrap(), mask.to_str().unwrap());
    let not_an_image = dir.join("notes.txt");
    std::fs::write(&not_an_image, "not an image").unwrap();
    let text = not_an_image.to_str().unwrap();
    let (black, small) = (dir.join("black.png"), dir.join("small.png"));
    std::fs::write(&black, flux_lite_platform::pipeline::image_file::encode_png(66, 50, &[0; 66 * 50 * 3], &[]).unwrap()).unwrap();
    std::fs::write(&small, flux_lite_platform::pipeline::image_file::encode_png(32, 32, &[255; 32 * 32 * 3], &[]).unwrap()).unwrap();
    let (black, small) = (black.to_str().unwrap(), small.to_str().unwrap());
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--mask", mask], "--mask needs --init-image"),
        (vec!["--strength", "0.5"], "--strength needs --init-image"),
        (vec!["--init-image", init, "--strength", "0"], "--strength 0: give a number in (0, 1]"),
        (vec!["--init-image", init, "--strength", "1.5"], "--strength 1.5"),
        (vec!["--init-image", init, "--width", "32"], "--width 32: the init image sets the size (64 here)"),
        (vec!["--init-image", text], "not a PNG or JPEG"),
        (vec!["--init-image", init, "--mask", text], "--mask"),
        (vec!["--init-image", init, "--mask-crop", "8"], "--mask-crop needs --mask"),
        (vec!["--mask-crop", "8"], "--mask-crop needs --init-image and --mask"),
        (vec!["--init-image", init, "--mask", black, "--mask-crop", "8"], "all black"),
        (vec!["--init-image", init, "--mask", small, "--mask-crop", "8"], "a masked crop needs the mask at the init image's size, 66×50"),
    ];
    for (args, want) in cases {
        let all: Vec<&str> = ["--prompt", "x"].into_iter().chain(args.iter().copied()).collect();
        let line = the_error_line(&gen("tiny-a", &all, &out));
        assert!(line.contains(want), "{args:?}: {line}");
        assert!(!out.exists(), "{args:?} wrote a file");
    }
    // The KV pipeline has no image-to-image or inpainting.
    let line = flux_lite_tests::only_an_error_line(&gen("tiny-9b-kv", &["--prompt", "x", "--init-image", init], &out));
    assert!(line.starts_with("error: --init-image: this model's pipeline (Flux2KleinKVPipeline) takes reference images, not an init image"), "{line}");
    assert!(!out.exists());
}
