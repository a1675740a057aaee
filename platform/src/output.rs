//! Output files: written beside their final name and renamed into place, so
//! a failed or interrupted run never leaves a partial file under that name.

use safetensors::tensor::{Dtype, TensorView};
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The temporary name a file is written under before the rename: hidden,
/// in the same directory (a rename across file systems is not atomic).
fn temp_path(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    path.with_file_name(format!(".{name}.partial-{}", std::process::id()))
}

/// Writes `bytes` to `path` atomically: temp file, fsync, rename. On error
/// the temp file is removed and `path` is left as it was.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let tmp = temp_path(path);
    let result = std::fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(bytes).and_then(|_| f.sync_all()))
        .and_then(|_| std::fs::rename(&tmp, path));
    result.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("{}: {e}", path.display())
    })
}

/// Writes f32 `[rows, cols]` tensors as safetensors with string metadata, atomically.
pub fn write_f32_tensors(path: &Path, tensors: &[(&str, &[f32])], cols: usize, metadata: &[(&str, String)]) -> Result<(), String> {
    let bytes: Vec<Vec<u8>> = tensors.iter().map(|(_, v)| v.iter().flat_map(|x| x.to_le_bytes()).collect()).collect();
    let mut views = Vec::with_capacity(tensors.len());
    for ((name, values), data) in tensors.iter().zip(&bytes) {
        let shape = vec![values.len() / cols.max(1), cols];
        views.push((*name, TensorView::new(Dtype::F32, shape, data).map_err(|e| format!("{name}: {e}"))?));
    }
    let metadata: HashMap<String, String> = metadata.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
    let data = safetensors::serialize(views, Some(metadata)).map_err(|e| e.to_string())?;
    write_atomically(path, &data)
}

/// An 8-bit RGB PNG with UTF-8 text chunks (iTXt, so prompts in any script survive).
pub fn encode_png(width: u32, height: u32, rgb: &[u8], text: &[(&str, String)]) -> Result<Vec<u8>, String> {
    if rgb.len() != width as usize * height as usize * 3 {
        return Err(format!("an image of {width}×{height} needs {} RGB bytes, got {}", width as usize * height as usize * 3, rgb.len()));
    }
    let mut out = Vec::new();
    let mut enc = png::Encoder::new(&mut out, width, height);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    for (key, value) in text {
        enc.add_itxt_chunk(key.to_string(), value.clone()).map_err(|e| format!("PNG text chunk `{key}`: {e}"))?;
    }
    let mut writer = enc.write_header().map_err(|e| format!("PNG header: {e}"))?;
    writer.write_image_data(rgb).map_err(|e| format!("PNG data: {e}"))?;
    writer.finish().map_err(|e| format!("PNG: {e}"))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn png_round_trips_pixels_and_unicode_text() {
        let rgb: Vec<u8> = (0..4 * 3 * 3).map(|i| (i * 7) as u8).collect();
        let bytes = encode_png(4, 3, &rgb, &[("prompt", "東京 🦊 café".to_string()), ("seed", "42".into())]).unwrap();
        let mut reader = png::Decoder::new(std::io::Cursor::new(bytes)).read_info().unwrap();
        let texts: Vec<(String, String)> =
            reader.info().utf8_text.iter().map(|t| (t.keyword.clone(), t.get_text().unwrap())).collect();
        assert_eq!(texts, [("prompt".to_string(), "東京 🦊 café".to_string()), ("seed".into(), "42".into())]);
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        reader.next_frame(&mut buf).unwrap();
        assert_eq!(buf, rgb);
    }

    #[test]
    fn a_failed_write_leaves_nothing_behind() {
        let dir = std::env::temp_dir().join(format!("flux-lite-output-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let target = dir.join("no-such-dir").join("out.png");
        assert!(write_atomically(&target, b"x").is_err());
        let ok = dir.join("out.bin");
        write_atomically(&ok, b"abc").unwrap();
        assert_eq!(std::fs::read(&ok).unwrap(), b"abc");
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, ["out.bin"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
