//! Images as files: PNG, JPEG and WebP, each with the settings it was made
//! with where its format keeps text, and those settings read back.
//!
//! PNG keeps every `(key, text)` pair as a UTF-8 text chunk. JPEG and WebP
//! keep three of them in EXIF, as AUTOMATIC1111 and the tools that read it
//! expect: [`PARAMETERS`] in `UserComment` (UTF-16, "UNICODE" marked),
//! [`RECIPE`] in `ImageDescription` (ASCII: the JSON's other characters
//! escaped) and [`SOFTWARE`] in `Software`. WebP also carries them in XMP
//! (`dc:description`, `xmp:CreatorTool`, and the recipe in flux-lite's
//! namespace), which image managers show.

use exif::experimental::Writer as ExifWriter;
use exif::{Field, In, Tag, Value};
use image::ImageEncoder;
use std::path::Path;

/// The settings in AUTOMATIC1111's wording.
pub const PARAMETERS: &str = "parameters";
/// The whole request as JSON.
pub const RECIPE: &str = "flux-lite";
/// The program and version that made the image.
pub const SOFTWARE: &str = "software";

/// ASCII text longer than this goes into a compressed (zTXt) chunk.
const COMPRESS_TEXT_ABOVE: usize = 4096;

/// The JPEG quality when none is asked for.
pub const DEFAULT_JPEG_QUALITY: u8 = 90;

/// How an image file is written, by its name's extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageFormat {
    Png,
    /// Baseline JPEG at a quality in 1..=100.
    Jpeg { quality: u8 },
    /// Lossless WebP.
    Webp,
}

impl ImageFormat {
    /// The format a name asks for: `.png`, `.jpg`/`.jpeg`, `.webp` (any
    /// case); a name without an extension (`-`, a pipe, a device) is PNG.
    /// `quality` is JPEG's; given for another format it is an error.
    pub fn for_path(path: &Path, quality: Option<u8>) -> Result<Self, String> {
        let extension = path.extension().map(|e| e.to_string_lossy().to_ascii_lowercase());
        let format = match extension.as_deref() {
            None | Some("png") => ImageFormat::Png,
            Some("jpg" | "jpeg") => ImageFormat::Jpeg { quality: quality.unwrap_or(DEFAULT_JPEG_QUALITY) },
            Some("webp") => ImageFormat::Webp,
            Some(other) => return Err(format!("{}: .{other} is not written; name it .png, .jpg (or .jpeg) or .webp", path.display())),
        };
        Self::checked(format, quality)
    }

    /// The format by name, as a request names it: `png`, `jpeg` (or `jpg`), `webp`.
    pub fn named(name: &str, quality: Option<u8>) -> Result<Self, String> {
        let format = match name.to_ascii_lowercase().as_str() {
            "png" => ImageFormat::Png,
            "jpeg" | "jpg" => ImageFormat::Jpeg { quality: quality.unwrap_or(DEFAULT_JPEG_QUALITY) },
            "webp" => ImageFormat::Webp,
            other => return Err(format!("{other:?}: give png, jpeg or webp")),
        };
        Self::checked(format, quality)
    }

    fn checked(format: Self, quality: Option<u8>) -> Result<Self, String> {
        match (format, quality) {
            (ImageFormat::Jpeg { quality }, _) if !(1..=100).contains(&quality) => Err(format!("quality {quality}: give 1 to 100")),
            (ImageFormat::Png | ImageFormat::Webp, Some(q)) => Err(format!("quality {q}: only JPEG has a quality (PNG and WebP are written lossless)")),
            (format, _) => Ok(format),
        }
    }

    /// The format's name, as OpenAI's `output_format` says it.
    pub fn name(self) -> &'static str {
        match self {
            ImageFormat::Png => "png",
            ImageFormat::Jpeg { .. } => "jpeg",
            ImageFormat::Webp => "webp",
        }
    }

    /// The media type, as an HTTP answer names it.
    pub fn media_type(self) -> &'static str {
        match self {
            ImageFormat::Png => "image/png",
            ImageFormat::Jpeg { .. } => "image/jpeg",
            ImageFormat::Webp => "image/webp",
        }
    }
}

/// An 8-bit RGB image in `format`, carrying `text` where the format keeps it.
pub fn encode_image(format: ImageFormat, width: u32, height: u32, rgb: &[u8], text: &[(&str, String)]) -> Result<Vec<u8>, String> {
    check_size(width, height, rgb)?;
    match format {
        ImageFormat::Png => encode_png(width, height, rgb, text),
        ImageFormat::Jpeg { quality } => {
            let mut out = Vec::new();
            let mut encoder = image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, quality);
            if let Some(exif) = exif_of(text)? {
                encoder.set_exif_metadata(exif).map_err(|e| format!("JPEG EXIF: {e}"))?;
            }
            encoder.write_image(rgb, width, height, image::ExtendedColorType::Rgb8).map_err(|e| format!("JPEG: {e}"))?;
            Ok(out)
        }
        ImageFormat::Webp => {
            let mut out = Vec::new();
            let mut encoder = image_webp::WebPEncoder::new(&mut out);
            if let Some(exif) = exif_of(text)? {
                encoder.set_exif_metadata(exif);
            }
            if let Some(xmp) = xmp_of(text) {
                encoder.set_xmp_metadata(xmp.into_bytes());
            }
            encoder.encode(rgb, width, height, image_webp::ColorType::Rgb8).map_err(|e| format!("WebP: {e}"))?;
            Ok(out)
        }
    }
}

fn check_size(width: u32, height: u32, rgb: &[u8]) -> Result<(), String> {
    match rgb.len() == width as usize * height as usize * 3 {
        true => Ok(()),
        false => Err(format!("an image of {width}×{height} needs {} RGB bytes, got {}", width as usize * height as usize * 3, rgb.len())),
    }
}

/// An 8-bit RGB PNG with UTF-8 text chunks (iTXt, so prompts in any script survive).
pub fn encode_png(width: u32, height: u32, rgb: &[u8], text: &[(&str, String)]) -> Result<Vec<u8>, String> {
    check_size(width, height, rgb)?;
    let mut out = Vec::new();
    let mut enc = png::Encoder::new(&mut out, width, height);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    for (key, value) in text {
        // Long ASCII text (an input image in base64) compressed; the rest UTF-8 as it is.
        let added = match value.len() > COMPRESS_TEXT_ABOVE && value.is_ascii() {
            true => enc.add_ztxt_chunk(key.to_string(), value.clone()),
            false => enc.add_itxt_chunk(key.to_string(), value.clone()),
        };
        added.map_err(|e| format!("PNG text chunk `{key}`: {e}"))?;
    }
    let mut writer = enc.write_header().map_err(|e| format!("PNG header: {e}"))?;
    writer.write_image_data(rgb).map_err(|e| format!("PNG data: {e}"))?;
    writer.finish().map_err(|e| format!("PNG: {e}"))?;
    Ok(out)
}

/// A PNG's text chunks (tEXt, zTXt and iTXt, before the pixels or after
/// them), by kind; an error names what is wrong with the file.
pub fn png_text_chunks(bytes: &[u8]) -> Result<Vec<(String, String)>, String> {
    let mut decoder = png::Decoder::new(std::io::Cursor::new(bytes));
    decoder.set_ignore_text_chunk(false);
    let mut reader = decoder.read_info().map_err(|e| format!("not a PNG file ({e})"))?;
    // The chunks after the image data are read only once it has been.
    let mut pixels = vec![0; reader.output_buffer_size().ok_or("a PNG too large to read")?];
    reader.next_frame(&mut pixels).map_err(|e| format!("a broken PNG ({e})"))?;
    reader.finish().map_err(|e| format!("a broken PNG ({e})"))?;
    let info = reader.info();
    let mut text: Vec<(String, String)> = info.uncompressed_latin1_text.iter().map(|t| (t.keyword.clone(), t.text.clone())).collect();
    for t in &info.compressed_latin1_text {
        text.push((t.keyword.clone(), t.get_text().map_err(|e| format!("its `{}` text chunk: {e}", t.keyword))?));
    }
    for t in &info.utf8_text {
        text.push((t.keyword.clone(), t.get_text().map_err(|e| format!("its `{}` text chunk: {e}", t.keyword))?));
    }
    Ok(text)
}


/// The settings an image file carries as `(key, text)` pairs: a PNG's text
/// chunks, or what a JPEG's or WebP's EXIF holds under the keys PNG uses;
/// an error names what is wrong with the file.
pub fn image_text(bytes: &[u8]) -> Result<Vec<(String, String)>, String> {
    if bytes.starts_with(b"\x89PNG") {
        return png_text_chunks(bytes);
    }
    let is_jpeg = bytes.starts_with(&[0xFF, 0xD8]);
    let is_webp = bytes.len() >= 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP";
    if !is_jpeg && !is_webp {
        return Err("not a PNG, JPEG or WebP file".into());
    }
    let exif = match exif::Reader::new().read_from_container(&mut std::io::Cursor::new(bytes)) {
        Ok(exif) => exif,
        Err(exif::Error::NotFound(_)) => return Ok(Vec::new()),
        Err(e) => return Err(format!("its EXIF cannot be read ({e})")),
    };
    let mut text = Vec::new();
    if let Some(Value::Undefined(comment, _)) = exif.get_field(Tag::UserComment, In::PRIMARY).map(|f| &f.value) {
        text.push((PARAMETERS.to_string(), user_comment(comment, exif.little_endian())?));
    }
    for (tag, key) in [(Tag::ImageDescription, RECIPE), (Tag::Software, SOFTWARE)] {
        if let Some(Value::Ascii(lines)) = exif.get_field(tag, In::PRIMARY).map(|f| &f.value) {
            let ascii: Vec<u8> = lines.concat();
            text.push((key.to_string(), String::from_utf8_lossy(&ascii).into_owned()));
        }
    }
    Ok(text)
}

/// The EXIF a JPEG or WebP carries `text` in, where it has any of the keys.
fn exif_of(text: &[(&str, String)]) -> Result<Option<Vec<u8>>, String> {
    let get = |key: &str| text.iter().find(|(k, _)| *k == key).map(|(_, v)| v.as_str());
    let mut fields = Vec::new();
    if let Some(parameters) = get(PARAMETERS) {
        // EXIF's character code, then UTF-16 in the file's (big-endian) byte order, as A1111 writes it.
        let mut comment = b"UNICODE\0".to_vec();
        comment.extend(parameters.encode_utf16().flat_map(u16::to_be_bytes));
        fields.push(Field { tag: Tag::UserComment, ifd_num: In::PRIMARY, value: Value::Undefined(comment, 0) });
    }
    for (key, tag) in [(RECIPE, Tag::ImageDescription), (SOFTWARE, Tag::Software)] {
        if let Some(value) = get(key) {
            fields.push(Field { tag, ifd_num: In::PRIMARY, value: Value::Ascii(vec![ascii_escaped(value).into_bytes()]) });
        }
    }
    if fields.is_empty() {
        return Ok(None);
    }
    let mut writer = ExifWriter::new();
    for field in &fields {
        writer.push_field(field);
    }
    let mut out = std::io::Cursor::new(Vec::new());
    writer.write(&mut out, false).map_err(|e| format!("EXIF: {e}"))?;
    Ok(Some(out.into_inner()))
}

/// EXIF's ASCII holds 7-bit text: JSON keeps its meaning with every other
/// character written `\uXXXX` (UTF-16, as JSON escapes it).
fn ascii_escaped(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c.is_ascii() && c != '\0' {
            true => out.push(c),
            false => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
    }
    out
}

/// A `UserComment`: its 8-byte character code, then the text.
fn user_comment(bytes: &[u8], little_endian: bool) -> Result<String, String> {
    let (code, body) = bytes.split_at(bytes.len().min(8));
    let text = match code {
        b"UNICODE\0" => {
            let units = body.chunks_exact(2).map(|p| if little_endian { u16::from_le_bytes([p[0], p[1]]) } else { u16::from_be_bytes([p[0], p[1]]) });
            String::from_utf16(&units.collect::<Vec<_>>()).map_err(|_| "its EXIF UserComment is not UTF-16".to_string())?
        }
        _ => String::from_utf8_lossy(body).into_owned(),
    };
    Ok(text.trim_end_matches('\0').to_string())
}

/// WebP's XMP packet: the settings as image managers show them.
fn xmp_of(text: &[(&str, String)]) -> Option<String> {
    let get = |key: &str| text.iter().find(|(k, _)| *k == key).map(|(_, v)| xml_escaped(v));
    let parameters = get(PARAMETERS)?;
    let tool = get(SOFTWARE).map(|s| format!("<xmp:CreatorTool>{s}</xmp:CreatorTool>")).unwrap_or_default();
    let recipe = get(RECIPE).map(|r| format!("<fl:recipe>{r}</fl:recipe>")).unwrap_or_default();
    Some(format!(
        "<?xpacket begin=\"\u{feff}\" id=\"W5M0MpCehiHzreSzNTczkc9d\"?><x:xmpmeta xmlns:x=\"adobe:ns:meta/\"><rdf:RDF xmlns:rdf=\"http://www.w3.org/1999/02/22-rdf-syntax-ns#\"><rdf:Description rdf:about=\"\" xmlns:dc=\"http://purl.org/dc/elements/1.1/\" xmlns:xmp=\"http://ns.adobe.com/xap/1.0/\" xmlns:fl=\"https://flux-lite.invalid/ns/1.0/\"><dc:description><rdf:Alt><rdf:li xml:lang=\"x-default\">{parameters}</rdf:li></rdf:Alt></dc:description>{tool}{recipe}</rdf:Description></rdf:RDF></x:xmpmeta><?xpacket end=\"r\"?>"
    ))
}

fn xml_escaped(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn png_round_trips_pixels_and_unicode_text() {
        let rgb: Vec<u8> = (0..4 * 3 * 3).map(|i| (i * 7) as u8).collect();
        let bytes = encode_png(4, 3, &rgb, &[("prompt", "東京 🦊 café".to_string()), ("seed", "42".into())]).unwrap();
        let mut reader = png::Decoder::new(std::io::Cursor::new(bytes.as_slice())).read_info().unwrap();
        let texts: Vec<(String, String)> =
            reader.info().utf8_text.iter().map(|t| (t.keyword.clone(), t.get_text().unwrap())).collect();
        assert_eq!(texts, [("prompt".to_string(), "東京 🦊 café".to_string()), ("seed".into(), "42".into())]);
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        reader.next_frame(&mut buf).unwrap();
        assert_eq!(buf, rgb);
        assert_eq!(png_text_chunks(&bytes).unwrap(), texts);
    }

    #[test]
    fn text_after_the_pixels_and_latin1_text_are_read_too() {
        let mut bytes = Vec::new();
        let mut enc = png::Encoder::new(&mut bytes, 1, 1);
        enc.set_color(png::ColorType::Rgb);
        enc.add_text_chunk("parameters".into(), "a fox\nSteps: 4".into()).unwrap();
        let mut writer = enc.write_header().unwrap();
        writer.write_image_data(&[1, 2, 3]).unwrap();
        writer.write_text_chunk(&png::text_metadata::ZTXtChunk::new("comment", "after the pixels")).unwrap();
        writer.finish().unwrap();
        let got = png_text_chunks(&bytes).unwrap();
        assert_eq!(got, [("parameters".to_string(), "a fox\nSteps: 4".to_string()), ("comment".into(), "after the pixels".into())]);
        assert!(png_text_chunks(b"GIF89a").unwrap_err().starts_with("not a PNG file"));
    }


    fn settings() -> Vec<(&'static str, String)> {
        vec![
            (PARAMETERS, "a fox, 東京 🦊\nNegative prompt: blur\nSteps: 4, Seed: 42".to_string()),
            (RECIPE, r#"{"prompt":"a fox, 東京 🦊","seed":42}"#.to_string()),
            (SOFTWARE, "flux-lite 0.1.0".to_string()),
            ("seed", "42".to_string()),
        ]
    }

    #[test]
    fn jpeg_and_webp_carry_the_settings_in_exif_and_read_back() {
        let (w, h) = (16, 8);
        let rgb: Vec<u8> = (0..w * h * 3).map(|i| (i * 5 % 251) as u8).collect();
        for format in [ImageFormat::Jpeg { quality: 90 }, ImageFormat::Webp] {
            let bytes = encode_image(format, w as u32, h as u32, &rgb, &settings()).unwrap();
            let got = image_text(&bytes).unwrap();
            let get = |k: &str| got.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone());
            assert_eq!(get(PARAMETERS).as_deref(), Some(settings()[0].1.as_str()), "{format:?}");
            assert_eq!(get(SOFTWARE).as_deref(), Some("flux-lite 0.1.0"), "{format:?}");
            // The recipe's JSON in ASCII means the same JSON.
            let recipe: serde_json::Value = serde_json::from_str(&get(RECIPE).unwrap()).unwrap();
            assert_eq!(recipe["prompt"], "a fox, 東京 🦊");
            // The pixels: WebP lossless exactly, JPEG close (decoded by image).
            let decoded = image::load_from_memory(&bytes).unwrap().to_rgb8();
            assert_eq!(decoded.dimensions(), (w as u32, h as u32));
            let max = decoded.as_raw().iter().zip(&rgb).map(|(a, b)| a.abs_diff(*b)).max().unwrap();
            match format {
                ImageFormat::Webp => assert_eq!(max, 0, "WebP is lossless"),
                _ => assert!(max < 64, "JPEG at 90: max |Δ| {max}"),
            }
        }
        let xmp = xmp_of(&settings()).unwrap();
        assert!(xmp.contains("<rdf:li xml:lang=\"x-default\">a fox, 東京 🦊\nNegative prompt: blur") && xmp.contains("<fl:recipe>{&quot;prompt&quot;"), "{xmp}");
    }

    #[test]
    fn the_extension_chooses_the_format_and_quality_is_jpegs_alone() {
        let f = |name: &str, q: Option<u8>| ImageFormat::for_path(Path::new(name), q);
        assert_eq!(f("a.png", None), Ok(ImageFormat::Png));
        assert_eq!(f("a.JPG", None), Ok(ImageFormat::Jpeg { quality: DEFAULT_JPEG_QUALITY }));
        assert_eq!(f("a.jpeg", Some(75)), Ok(ImageFormat::Jpeg { quality: 75 }));
        assert_eq!(f("a.webp", None), Ok(ImageFormat::Webp));
        assert_eq!(f("-", None), Ok(ImageFormat::Png));
        assert!(f("a.gif", None).unwrap_err().contains(".gif is not written"));
        assert!(f("a.jpg", Some(0)).unwrap_err().contains("give 1 to 100"));
        assert!(f("a.png", Some(80)).unwrap_err().contains("only JPEG has a quality"));
        assert_eq!(ImageFormat::named("jpeg", Some(60)), Ok(ImageFormat::Jpeg { quality: 60 }));
        assert!(ImageFormat::named("gif", None).is_err());
        assert!(image_text(b"GIF89a......").unwrap_err().contains("not a PNG, JPEG or WebP"));
    }
}
