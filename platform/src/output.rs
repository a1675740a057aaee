//! Output files, written where the user points, through one function
//! ([`write_to`]):
//! - a regular file, or a name that does not exist yet: written beside its
//!   final name and renamed into place, so a failed or interrupted run never
//!   leaves a partial file under that name;
//! - a symbolic link: resolved first, its target written that way (the link
//!   stays a link);
//! - a named pipe, a character or block device, a socket: opened and written
//!   in place, never replaced;
//! - `-`: standard output.

use safetensors::tensor::{Dtype, TensorView, View};
use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// The temporary name a file is written under before the rename: hidden,
/// in the same directory (a rename across file systems is not atomic).
fn temp_path(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    path.with_file_name(format!(".{name}.partial-{}", std::process::id()))
}

/// The name that means standard output (`--output -`).
pub const STDOUT: &str = "-";

/// How a message names an output path: `standard output` for `-`.
pub fn shown(path: &Path) -> String {
    if path.as_os_str() == STDOUT {
        "standard output".into()
    } else {
        path.display().to_string()
    }
}

/// Where bytes for a path go.
#[derive(Debug, PartialEq, Eq)]
enum Target {
    /// `-`.
    Stdout,
    /// Something that exists and is not a regular file or a folder (a named
    /// pipe, a device, a socket, `/dev/stdout`): opened and written in place.
    InPlace,
    /// A regular file or a new one, symbolic links resolved: written atomically.
    Atomic(PathBuf),
}

fn target(path: &Path) -> Result<Target, String> {
    if path.as_os_str() == STDOUT {
        return Ok(Target::Stdout);
    }
    // `metadata` follows links: a link to a pipe or device is written in place too.
    match std::fs::metadata(path) {
        Ok(m) if !m.is_file() && !m.is_dir() => Ok(Target::InPlace),
        _ => resolve_links(path).map(Target::Atomic),
    }
}

/// `path` with every symbolic link along the chain followed (the last name
/// need not exist: a dangling link's target is created, as `cp` does).
fn resolve_links(path: &Path) -> Result<PathBuf, String> {
    let mut at = path.to_path_buf();
    for _ in 0..40 {
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.file_type().is_symlink() => {
                let link = std::fs::read_link(&at).map_err(|e| format!("{}: {e}", at.display()))?;
                // A relative link is relative to the folder holding it; an absolute one replaces it.
                at = at.parent().map_or(link.clone(), |folder| folder.join(&link));
            }
            _ => return Ok(at),
        }
    }
    Err(format!("{}: too many levels of symbolic links", path.display()))
}

/// Checks, before any work, that a file can be written at `path` (given
/// with `flag`): standard output that is not a terminal (a PNG would garble
/// it), a pipe or device, or a file name (through any links) whose folder
/// exists and which is not itself a folder.
pub fn check_output_path(flag: &str, path: &Path) -> Result<(), String> {
    let resolved = match target(path)? {
        Target::Stdout if std::io::IsTerminal::is_terminal(&std::io::stdout()) => {
            return Err(format!("{flag} -: standard output is a terminal; redirect it to a file or a pipe"));
        }
        Target::Stdout | Target::InPlace => return Ok(()),
        Target::Atomic(resolved) => resolved,
    };
    let through = if resolved == path { String::new() } else { format!(" (a link to {})", resolved.display()) };
    let folder = match resolved.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !folder.is_dir() {
        return Err(format!("{flag} {}{through}: the folder {} does not exist", path.display(), folder.display()));
    }
    if resolved.is_dir() {
        return Err(format!("{flag} {}{through}: is a folder, not a file name", path.display()));
    }
    Ok(())
}

/// Writes `bytes` to `path` (see the module's rules). On error nothing is
/// left under a regular file's name, and the error names the path.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), String> {
    write_to(path, &mut |w| {
        let (first, rest) = bytes.split_at(bytes.len() / 2);
        w.write_all(first)?;
        pause_mid_write(w)?;
        w.write_all(rest)
    })
}

/// Writes what `write` streams to `path` atomically (a temporary name, then
/// a rename), for outputs too large to hold (a quantized model file).
pub fn write_streamed(path: &Path, write: &mut dyn FnMut(&mut dyn Write) -> std::io::Result<()>) -> Result<(), String> {
    write_to(path, write)
}

/// A testing aid (`test-support` builds only): atomic writes stop halfway
/// for this many seconds, their first half on disk under the temporary
/// name, so a test can kill the process in the middle of writing (0: no
/// pause). Read from `FLUX_LITE_PAUSE_MID_WRITE` by [`test_switches`].
#[cfg(any(test, feature = "test-support"))]
static PAUSE_MID_WRITE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The tests' switch `FLUX_LITE_PAUSE_MID_WRITE=SECONDS` from the named
/// settings `get` gives (the CLI passes its environment's); in a build
/// without the `test-support` feature (which only the tests enable) there
/// is none, and this does nothing.
pub fn test_switches(get: &dyn Fn(&str) -> Option<String>) {
    #[cfg(any(test, feature = "test-support"))]
    if let Some(seconds) = get("FLUX_LITE_PAUSE_MID_WRITE").and_then(|v| v.trim().parse::<u64>().ok()) {
        PAUSE_MID_WRITE.store(seconds, std::sync::atomic::Ordering::Relaxed);
    }
    let _ = get;
}

#[cfg(not(any(test, feature = "test-support")))]
fn pause_mid_write(_: &mut dyn Write) -> std::io::Result<()> {
    Ok(())
}

#[cfg(any(test, feature = "test-support"))]
fn pause_mid_write(w: &mut dyn Write) -> std::io::Result<()> {
    let seconds = PAUSE_MID_WRITE.load(std::sync::atomic::Ordering::Relaxed);
    if seconds == 0 {
        return Ok(());
    }
    w.flush()?;
    eprintln!("paused mid-write for {seconds} s");
    std::thread::sleep(std::time::Duration::from_secs(seconds));
    Ok(())
}

/// The one function every output goes through: the contents streamed by
/// `write` to where `path` points.
fn write_to(path: &Path, write: &mut dyn FnMut(&mut dyn Write) -> std::io::Result<()>) -> Result<(), String> {
    let streamed = |out: &mut dyn Write, write: &mut dyn FnMut(&mut dyn Write) -> std::io::Result<()>| {
        let mut w = BufWriter::with_capacity(1 << 20, out);
        write(&mut w)?;
        w.flush()
    };
    match target(path)? {
        Target::Stdout => streamed(&mut std::io::stdout().lock(), write).map_err(|e| format!("standard output: {e}")),
        Target::InPlace => {
            let result = std::fs::OpenOptions::new().write(true).open(path).and_then(|mut f| streamed(&mut f, write));
            result.map_err(|e| format!("{}: {e}", path.display()))
        }
        Target::Atomic(resolved) => write_atomically_at(&resolved, write).map_err(|e| format!("{}: {e}", path.display())),
    }
}

/// Temp file beside `path`, fsync, rename. On error the temp file is
/// removed and `path` is left as it was.
fn write_atomically_at(path: &Path, write: &mut dyn FnMut(&mut dyn Write) -> std::io::Result<()>) -> std::io::Result<()> {
    let tmp = temp_path(path);
    let result = File::create(&tmp)
        .and_then(|f| {
            let mut w = BufWriter::with_capacity(1 << 20, f);
            write(&mut w)?;
            w.into_inner().map_err(|e| e.into_error())?.sync_all()
        })
        .and_then(|_| std::fs::rename(&tmp, path));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// A tensor as safetensors' header writer sees it: its length, not its bytes,
/// which [`write_tensors`] streams after the header.
struct Layout {
    dtype: Dtype,
    shape: Vec<usize>,
    len: usize,
}

impl View for Layout {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&[])
    }
    fn data_len(&self) -> usize {
        self.len
    }
}

/// Writes tensors `(name, dtype, shape, little-endian bytes)` as one
/// safetensors file, atomically, the data streamed from the given slices
/// (never gathered in memory). Metadata, when given, goes in the header's
/// `__metadata__`.
pub fn write_tensors<'a>(
    path: &Path,
    tensors: impl IntoIterator<Item = (String, Dtype, Vec<usize>, &'a [u8])>,
    metadata: &[(&str, String)],
) -> Result<(), String> {
    let failed = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let mut data: HashMap<String, &[u8]> = HashMap::new();
    let mut layouts = Vec::new();
    for (name, dtype, shape, bytes) in tensors {
        TensorView::new(dtype, shape.clone(), bytes).map_err(|e| failed(&format!("tensor `{name}`: {e}")))?;
        layouts.push((name.clone(), Layout { dtype, shape, len: bytes.len() }));
        data.insert(name, bytes);
    }
    let metadata = (!metadata.is_empty()).then(|| metadata.iter().map(|(k, v)| (k.to_string(), v.clone())).collect());
    // safetensors lays out the header (its order, offsets and padding); the data follows in offset order.
    let header = safetensors::serialize(layouts, metadata).map_err(|e| failed(&e))?;
    let mut parsed: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&header[8..]).map_err(|e| failed(&e))?;
    // The metadata went through a HashMap: put its keys in order, so the
    // same run writes the same bytes.
    let header = match parsed.get_mut("__metadata__") {
        Some(serde_json::Value::Object(m)) => {
            m.sort_keys();
            header_bytes(&parsed).map_err(|e| failed(&e))?
        }
        _ => header,
    };
    let start = |name: &str| parsed.get(name).and_then(|t| t["data_offsets"][0].as_u64()).unwrap_or(0);
    let mut order: Vec<(&String, &[u8])> = data.iter().map(|(n, b)| (n, *b)).collect();
    order.sort_by_key(|(name, _)| start(name));
    write_to(path, &mut |w| {
        w.write_all(&header)?;
        order.iter().try_for_each(|(_, bytes)| w.write_all(bytes))
    })
}

/// A safetensors header: its JSON's length (u64 LE), then the JSON padded
/// with spaces to a multiple of 8 bytes, as the format requires.
fn header_bytes(json: &serde_json::Map<String, serde_json::Value>) -> Result<Vec<u8>, serde_json::Error> {
    let mut text = serde_json::to_vec(json)?;
    text.resize(text.len().next_multiple_of(8), b' ');
    Ok([(text.len() as u64).to_le_bytes().as_slice(), &text].concat())
}

/// Writes f32 `[rows, cols]` tensors as safetensors with string metadata, atomically.
pub fn write_f32_tensors(path: &Path, tensors: &[(&str, &[f32])], cols: usize, metadata: &[(&str, String)]) -> Result<(), String> {
    let bytes: Vec<Vec<u8>> = tensors.iter().map(|(_, v)| v.iter().flat_map(|x| x.to_le_bytes()).collect()).collect();
    let entries = tensors.iter().zip(&bytes).map(|((name, values), data)| {
        (name.to_string(), Dtype::F32, vec![values.len() / cols.max(1), cols], data.as_slice())
    });
    write_tensors(path, entries, metadata)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileTypeExt;

    /// A fresh folder of this test's own (the tests run in parallel).
    fn folder(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("flux-lite-output-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_symlink_is_written_through_and_stays_a_link() {
        let dir = folder("symlink");
        std::fs::create_dir(dir.join("renders")).unwrap();
        std::fs::write(dir.join("renders/0042.png"), b"old").unwrap();
        let link = dir.join("latest.png");
        std::os::unix::fs::symlink("renders/0042.png", &link).unwrap();
        // A link to a link, absolute this time.
        let outer = dir.join("outer.png");
        std::os::unix::fs::symlink(&link, &outer).unwrap();
        check_output_path("--output", &outer).unwrap();
        write_atomically(&outer, b"new bytes").unwrap();
        assert_eq!(std::fs::read(dir.join("renders/0042.png")).unwrap(), b"new bytes");
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
        assert!(std::fs::symlink_metadata(&outer).unwrap().file_type().is_symlink());
        // Nothing else is left in either folder.
        let names = |d: &Path| std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect::<Vec<_>>();
        assert_eq!(names(&dir.join("renders")), ["0042.png"]);
        // A dangling link: its target is created.
        let dangling = dir.join("next.png");
        std::os::unix::fs::symlink("renders/0043.png", &dangling).unwrap();
        write_atomically(&dangling, b"fresh").unwrap();
        assert_eq!(std::fs::read(dir.join("renders/0043.png")).unwrap(), b"fresh");
        assert!(std::fs::symlink_metadata(&dangling).unwrap().file_type().is_symlink());
        // A link into a folder that does not exist is refused before any work, naming both.
        let nowhere = dir.join("nowhere.png");
        std::os::unix::fs::symlink("missing/x.png", &nowhere).unwrap();
        let err = check_output_path("--output", &nowhere).unwrap_err();
        assert!(err.contains("nowhere.png (a link to") && err.contains("does not exist"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_named_pipe_is_written_into_not_replaced() {
        let dir = folder("fifo");
        let fifo = dir.join("out.png");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
        assert!(made.success());
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || std::fs::read(&fifo).unwrap())
        };
        check_output_path("--output", &fifo).unwrap();
        let bytes: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        write_atomically(&fifo, &bytes).unwrap();
        assert_eq!(reader.join().unwrap(), bytes);
        assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo(), "the pipe was replaced");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn dev_full_is_one_error_and_stays_a_device() {
        let full = Path::new("/dev/full");
        if !std::fs::metadata(full).is_ok_and(|m| m.file_type().is_char_device()) {
            flux_lite_kernels::skip::skipped("this machine has no /dev/full character device");
            return;
        }
        check_output_path("--output", full).unwrap();
        let err = write_atomically(full, &[7u8; 4 << 20]).unwrap_err();
        assert!(err.starts_with("/dev/full: ") && err.contains("No space left"), "{err}");
        assert!(std::fs::metadata(full).unwrap().file_type().is_char_device(), "/dev/full is no longer a device");
    }

    #[test]
    fn a_full_file_system_leaves_no_file() {
        let dir = folder("tmpfs");
        let mounted = std::process::Command::new("mount").args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"]).arg(&dir).output();
        match mounted {
            Ok(out) if out.status.success() => {}
            Ok(out) => {
                flux_lite_kernels::skip::skipped(format_args!("cannot mount a tiny tmpfs here (needs root): {}", String::from_utf8_lossy(&out.stderr).trim()));
                let _ = std::fs::remove_dir_all(&dir);
                return;
            }
            Err(e) => {
                flux_lite_kernels::skip::skipped(format_args!("cannot run mount: {e}"));
                let _ = std::fs::remove_dir_all(&dir);
                return;
            }
        }
        let path = dir.join("big.png");
        let err = write_atomically(&path, &[1u8; 1 << 20]).unwrap_err();
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        let _ = std::process::Command::new("umount").arg(&dir).status();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(err.contains("big.png") && err.contains("No space left"), "{err}");
        assert!(left.is_empty(), "left behind: {left:?}");
    }

    #[test]
    fn targets_by_kind() {
        assert_eq!(target(Path::new("-")).unwrap(), Target::Stdout);
        assert_eq!(target(Path::new("/dev/null")).unwrap(), Target::InPlace);
        assert_eq!(target(Path::new("no/such/file.png")).unwrap(), Target::Atomic(PathBuf::from("no/such/file.png")));
        let dir = folder("loop");
        let (a, b) = (dir.join("a"), dir.join("b"));
        std::os::unix::fs::symlink(&b, &a).unwrap();
        std::os::unix::fs::symlink(&a, &b).unwrap();
        assert!(target(&a).unwrap_err().contains("too many levels of symbolic links"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_same_tensors_and_metadata_give_the_same_bytes() {
        // Its own folder: the tests run in parallel, and another lists its folder.
        let dir = std::env::temp_dir().join(format!("flux-lite-output-bytes-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let metadata = [("prompt", "a fox".to_string()), ("model", "m".into()), ("seed", "1".into()), ("steps", "4".into())];
        let files: Vec<Vec<u8>> = (0..8)
            .map(|i| {
                let path = dir.join(format!("t{i}.safetensors"));
                write_f32_tensors(&path, &[("a", &[1.0, 2.0]), ("b", &[3.0])], 1, &metadata).unwrap();
                std::fs::read(&path).unwrap()
            })
            .collect();
        assert!(files.iter().all(|f| f == &files[0]), "the metadata order changed between writes");
        let st = safetensors::SafeTensors::read_metadata(&files[0]).unwrap().1;
        assert_eq!(st.metadata().as_ref().map(|m| m.len()), Some(4));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn streamed_tensors_are_the_file_safetensors_serializes() {
        let (a, b, c): (Vec<u8>, Vec<u8>, Vec<u8>) = ((0..6).collect(), (0..16).map(|i| i * 3).collect(), vec![]);
        let tensors = [
            ("b.weight".to_string(), Dtype::BF16, vec![2, 4], b.as_slice()),
            ("a.luts".to_string(), Dtype::U8, vec![6], a.as_slice()),
            ("a.split_positions".to_string(), Dtype::I64, vec![0], c.as_slice()),
        ];
        let path = std::env::temp_dir().join(format!("flux-lite-tensors-{}.safetensors", std::process::id()));
        for metadata in [vec![], vec![("k", "v".to_string())]] {
            write_tensors(&path, tensors.iter().cloned(), &metadata).unwrap();
            let views = tensors.iter().map(|(n, d, s, b)| (n.as_str(), TensorView::new(*d, s.clone(), b).unwrap()));
            let meta = (!metadata.is_empty()).then(|| metadata.iter().map(|(k, v)| (k.to_string(), v.clone())).collect());
            assert_eq!(std::fs::read(&path).unwrap(), safetensors::serialize(views, meta).unwrap());
        }
        std::fs::remove_file(&path).unwrap();
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
