//! GGUF files (version 2 and 3) as llama.cpp, stable-diffusion.cpp and
//! ComfyUI-GGUF write them: a header, metadata, tensor infos, then the
//! tensors' data at `general.alignment` (32 by default). Read in place from
//! the memory-mapped file: every count, length and offset is checked
//! against the file before it is used, so a truncated or lying file is an
//! error naming what is wrong, never a panic or a huge allocation.
//!
//! Hand-written: the Rust GGUF crates either read through `std::io` into
//! owned buffers (a copy of every tensor) or come with a tensor library; here
//! the tensors stay in the map and only their ranges are recorded.

use flux_lite_core::ggml::GgmlType;

/// "GGUF" as the first four bytes.
const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's `GGML_MAX_DIMS`.
const MAX_DIMS: u32 = 4;

/// One tensor of a GGUF file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufTensor {
    pub name: String,
    /// Outermost dimension first, as gguf-py and PyTorch see it (GGUF
    /// stores `ne`, innermost first).
    pub shape: Vec<usize>,
    pub ggml: GgmlType,
    /// Byte range in the file.
    pub range: std::ops::Range<usize>,
}

impl GgufTensor {
    pub fn elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// Bytes of one row (the innermost dimension).
    pub fn row_bytes(&self) -> usize {
        let width = self.shape.last().copied().unwrap_or(1);
        width / self.ggml.block_elements() * self.ggml.block_bytes()
    }
}

/// What a GGUF file holds, its data left in place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufHeader {
    pub version: u32,
    /// `general.architecture`, when the file names one.
    pub architecture: Option<String>,
    pub tensors: Vec<GgufTensor>,
}

/// Reads the header of a GGUF file held whole in `bytes`.
pub fn parse(bytes: &[u8]) -> Result<GgufHeader, String> {
    let mut r = Reader { bytes, at: 0 };
    if r.take(4, "the magic")? != MAGIC {
        return Err("not a GGUF file (it does not start with `GGUF`)".into());
    }
    let version = r.u32("the version")?;
    if !(2..=3).contains(&version) {
        return Err(format!("GGUF version {version}; flux-lite reads versions 2 and 3"));
    }
    let n_tensors = r.u64("the tensor count")?;
    let n_metadata = r.u64("the metadata count")?;
    let mut architecture = None;
    let mut alignment = DEFAULT_ALIGNMENT;
    for _ in 0..n_metadata {
        let key = r.string("a metadata key")?;
        let kind = r.u32("a metadata type")?;
        match (key.as_str(), kind) {
            ("general.architecture", STRING) => architecture = Some(r.string("general.architecture")?),
            ("general.alignment", U32) => {
                alignment = r.u32("general.alignment")? as u64;
                if alignment == 0 || !alignment.is_power_of_two() {
                    return Err(format!("general.alignment is {alignment}, not a power of two"));
                }
            }
            _ => r.skip_value(kind, &key, 0)?,
        }
    }
    let mut infos = Vec::new();
    for _ in 0..n_tensors {
        let name = r.string("a tensor name")?;
        let n_dims = r.u32("a tensor's dimension count")?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(format!("tensor `{name}` has {n_dims} dimensions (1 to {MAX_DIMS} allowed)"));
        }
        let mut ne = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            ne.push(r.u64("a tensor dimension")?);
        }
        let id = r.u32("a tensor type")?;
        let ggml = GgmlType::from_id(id).ok_or_else(|| format!("tensor `{name}` has GGML type {id}, which flux-lite does not read"))?;
        let offset = r.u64("a tensor offset")?;
        infos.push((name, ne, ggml, offset));
    }
    let data_start = (r.at as u64).next_multiple_of(alignment);
    let mut tensors = Vec::with_capacity(infos.len());
    for (name, ne, ggml, offset) in infos {
        if ne.contains(&0) {
            return Err(format!("tensor `{name}` has a dimension of 0"));
        }
        let elements = ne.iter().try_fold(1u64, |n, &d| n.checked_mul(d)).ok_or_else(|| format!("tensor `{name}`: its dimensions overflow"))?;
        if ne[0] % ggml.block_elements() as u64 != 0 {
            return Err(format!("tensor `{name}`: rows of {} elements are not whole {} blocks of {}", ne[0], ggml.name(), ggml.block_elements()));
        }
        let size = ggml.bytes_of(elements).ok_or_else(|| format!("tensor `{name}`: {elements} elements are not whole blocks"))?;
        if !offset.is_multiple_of(alignment) {
            return Err(format!("tensor `{name}`: its offset {offset} is not a multiple of the file's alignment {alignment}"));
        }
        let start = data_start.checked_add(offset).ok_or_else(|| format!("tensor `{name}`: offset {offset} overflows"))?;
        let end = start.checked_add(size).filter(|&e| e <= bytes.len() as u64).ok_or_else(|| {
            format!("tensor `{name}` ({} bytes at offset {offset}) runs past the end of the file ({} bytes)", size, bytes.len())
        })?;
        let shape = ne.iter().rev().map(|&d| d as usize).collect();
        tensors.push(GgufTensor { name, shape, ggml, range: start as usize..end as usize });
    }
    let mut names: Vec<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
    names.sort_unstable();
    if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(format!("tensor `{}` appears twice", w[0]));
    }
    Ok(GgufHeader { version, architecture, tensors })
}

// Metadata value types.
const U8: u32 = 0;
const I8: u32 = 1;
const U16: u32 = 2;
const I16: u32 = 3;
const U32: u32 = 4;
const I32: u32 = 5;
const F32: u32 = 6;
const BOOL: u32 = 7;
const STRING: u32 = 8;
const ARRAY: u32 = 9;
const U64: u32 = 10;
const I64: u32 = 11;
const F64: u32 = 12;

/// Arrays of arrays deeper than this are refused (no writer nests them).
const MAX_NESTING: u32 = 4;

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], String> {
        let end = (self.at as u64).checked_add(n).filter(|&e| e <= self.bytes.len() as u64);
        let end = end.ok_or_else(|| format!("the file ends inside {what} (byte {} of {})", self.at, self.bytes.len()))? as usize;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn u32(&mut self, what: &str) -> Result<u32, String> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self, what: &str) -> Result<u64, String> {
        let b = self.take(8, what)?;
        Ok(u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
    }

    fn string(&mut self, what: &str) -> Result<String, String> {
        let n = self.u64(what)?;
        let b = self.take(n, what)?;
        String::from_utf8(b.to_vec()).map_err(|_| format!("{what} is not UTF-8"))
    }

    /// Steps over a metadata value of type `kind`.
    fn skip_value(&mut self, kind: u32, key: &str, depth: u32) -> Result<(), String> {
        let what = format!("metadata `{key}`");
        match kind {
            U8 | I8 | BOOL => self.take(1, &what).map(drop),
            U16 | I16 => self.take(2, &what).map(drop),
            U32 | I32 | F32 => self.take(4, &what).map(drop),
            U64 | I64 | F64 => self.take(8, &what).map(drop),
            STRING => {
                let n = self.u64(&what)?;
                self.take(n, &what).map(drop)
            }
            ARRAY if depth < MAX_NESTING => {
                let item = self.u32(&what)?;
                let n = self.u64(&what)?;
                match fixed_size(item) {
                    // Fixed-size items are stepped over at once; the length check bounds `n`.
                    Some(size) => self.take(n.checked_mul(size).ok_or_else(|| format!("{what}: its array length overflows"))?, &what).map(drop),
                    None => (0..n).try_for_each(|_| self.skip_value(item, key, depth + 1)),
                }
            }
            other => Err(format!("{what} has value type {other}, which GGUF does not define")),
        }
    }
}

fn fixed_size(kind: u32) -> Option<u64> {
    match kind {
        U8 | I8 | BOOL => Some(1),
        U16 | I16 => Some(2),
        U32 | I32 | F32 => Some(4),
        U64 | I64 | F64 => Some(8),
        _ => None,
    }
}

/// The data alignment flux-lite writes (GGUF's default).
pub const ALIGNMENT: u64 = DEFAULT_ALIGNMENT;

/// A GGUF v3 header as gguf-py's `GGUFWriter` lays it out: the magic, the
/// counts, `general.architecture` and `general.quantization_version` (2),
/// then per tensor `(name, ne innermost first, type, data bytes)` its info,
/// each tensor's data at the next [`ALIGNMENT`] offset; the header is
/// padded so the first tensor's data follows it.
pub fn header(architecture: &str, tensors: &[(String, Vec<u64>, GgmlType, u64)]) -> Vec<u8> {
    let mut out = Vec::new();
    let string = |out: &mut Vec<u8>, s: &str| {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    };
    out.extend(MAGIC);
    out.extend(3u32.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    out.extend(2u64.to_le_bytes());
    string(&mut out, "general.architecture");
    out.extend(STRING.to_le_bytes());
    string(&mut out, architecture);
    string(&mut out, "general.quantization_version");
    out.extend(U32.to_le_bytes());
    out.extend(2u32.to_le_bytes());
    let mut offset = 0u64;
    for (name, ne, ggml, bytes) in tensors {
        string(&mut out, name);
        out.extend((ne.len() as u32).to_le_bytes());
        for d in ne {
            out.extend(d.to_le_bytes());
        }
        out.extend(ggml.id().to_le_bytes());
        out.extend(offset.to_le_bytes());
        offset = (offset + bytes).next_multiple_of(ALIGNMENT);
    }
    out.resize(out.len().next_multiple_of(ALIGNMENT as usize), 0);
    out
}

/// A whole GGUF file: [`header`] and the tensors' data (for tests and the
/// fuzz corpus).
pub fn write(architecture: &str, tensors: &[(&str, &[u64], GgmlType, &[u8])]) -> Vec<u8> {
    let infos: Vec<(String, Vec<u64>, GgmlType, u64)> = tensors.iter().map(|(n, ne, g, d)| (n.to_string(), ne.to_vec(), *g, d.len() as u64)).collect();
    let mut out = header(architecture, &infos);
    for (_, _, _, data) in tensors {
        out.resize(out.len().next_multiple_of(ALIGNMENT as usize), 0);
        out.extend(*data);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        let q8 = vec![0u8; 2 * 34];
        let f32s = vec![0u8; 3 * 4];
        write("flux", &[("a.weight", &[32, 2], GgmlType::Q8_0, &q8), ("b", &[3], GgmlType::F32, &f32s)])
    }

    #[test]
    fn a_written_file_reads_back() {
        let bytes = sample();
        let h = parse(&bytes).unwrap();
        assert_eq!(h.architecture.as_deref(), Some("flux"));
        assert_eq!(h.tensors.len(), 2);
        assert_eq!(h.tensors[0].shape, vec![2, 32]);
        assert_eq!(h.tensors[0].range.len(), 68);
        assert_eq!(h.tensors[0].row_bytes(), 34);
        assert_eq!(h.tensors[1].shape, vec![3]);
        assert!(h.tensors[1].range.start.is_multiple_of(32));
    }

    #[test]
    fn every_truncation_is_an_error() {
        let bytes = sample();
        for n in 0..bytes.len() - 1 {
            assert!(parse(&bytes[..n]).is_err(), "{n} bytes parsed");
        }
    }

    #[test]
    fn lies_are_named() {
        let q8 = vec![0u8; 34];
        let short = write("flux", &[("w", &[32, 2], GgmlType::Q8_0, &q8)]);
        assert!(parse(&short).unwrap_err().contains("runs past the end"), "{}", parse(&short).unwrap_err());
        let ragged = write("flux", &[("w", &[31, 1], GgmlType::Q8_0, &q8)]);
        assert!(parse(&ragged).unwrap_err().contains("not whole Q8_0 blocks"));
        let mut unknown = write("flux", &[("w", &[32], GgmlType::Q8_0, &q8)]);
        // The type id follows the name, the dimension count and one dimension.
        let pos = find(&unknown, b"w") + 1 + 4 + 8;
        unknown[pos..pos + 4].copy_from_slice(&9u32.to_le_bytes());
        assert!(parse(&unknown).unwrap_err().contains("GGML type 9"));
        let mut huge = sample();
        // The metadata count: 2^60 entries.
        huge[16..24].copy_from_slice(&(1u64 << 60).to_le_bytes());
        assert!(parse(&huge).is_err());
        assert!(parse(b"GGUF\x01\0\0\0").unwrap_err().contains("version 1"));
        assert!(parse(b"PK\x03\x04").unwrap_err().contains("not a GGUF file"));
    }

    #[test]
    fn no_single_byte_change_panics() {
        let bytes = sample();
        for at in 0..bytes.len() {
            for v in [0x00, 0x01, 0x7f, 0x80, 0xff] {
                let mut b = bytes.clone();
                b[at] = v;
                let _ = parse(&b);
            }
        }
    }

    fn find(hay: &[u8], needle: &[u8]) -> usize {
        hay.windows(needle.len()).rposition(|w| w == needle).unwrap()
    }
}
