//! The prompt, from `--prompt TEXT` or `--prompt-file FILE` (for prompts
//! longer than a command line may carry, or kept in a file).

use std::io::Read;
use std::path::Path;

/// Prompts above this are refused before tokenizing: the text encoder reads
/// only the first 512 tokens (a few KB of text), so megabytes are a mistake.
pub const MAX_PROMPT_BYTES: u64 = flux_lite_platform::pipeline::job::MAX_PROMPT_BYTES as u64;

/// The prompt the flags give, if any; both at once is an error.
pub fn from_flags(text: Option<&str>, file: Option<&Path>) -> Result<Option<String>, String> {
    match (text, file) {
        (Some(_), Some(_)) => Err("give --prompt or --prompt-file, not both".into()),
        (Some(text), None) => check_size("--prompt", text.len() as u64).map(|()| Some(text.to_owned())),
        (None, Some(path)) => read_file(path).map(Some),
        (None, None) => Ok(None),
    }
}

/// `--batch-file`'s prompts: one per line, blank lines skipped, each within the prompt limit.
pub fn lines(path: &Path) -> Result<Vec<String>, String> {
    let flag = format!("--batch-file {}", path.display());
    let text = read_text(&flag, path, MAX_BATCH_FILE_BYTES, &|n| match n > MAX_BATCH_FILE_BYTES {
        true => Err(format!("{flag}: over {} MiB of prompts", MAX_BATCH_FILE_BYTES >> 20)),
        false => Ok(()),
    })?;
    let lines: Vec<String> = text.lines().map(|l| l.strip_suffix('\r').unwrap_or(l)).filter(|l| !l.trim().is_empty()).map(str::to_owned).collect();
    if lines.is_empty() {
        return Err(format!("{flag}: no prompts (one per line)"));
    }
    for (i, line) in lines.iter().enumerate() {
        check_size(&format!("{flag} prompt {}", i + 1), line.len() as u64)?;
    }
    Ok(lines)
}

/// A batch file holds many prompts, each within [`MAX_PROMPT_BYTES`].
pub const MAX_BATCH_FILE_BYTES: u64 = 64 << 20;

fn read_file(path: &Path) -> Result<String, String> {
    let flag = format!("--prompt-file {}", path.display());
    let text = read_text(&flag, path, MAX_PROMPT_BYTES, &|n| check_size(&flag, n))?;
    // A file's final line break is not part of the prompt.
    Ok(text.strip_suffix('\n').map(|t| t.strip_suffix('\r').unwrap_or(t)).unwrap_or(&text).to_owned())
}

/// A UTF-8 file, read to at most one byte past `limit` (enough for `size`
/// to tell it is too long), errors named by `flag`.
fn read_text(flag: &str, path: &Path, limit: u64, size: &dyn Fn(u64) -> Result<(), String>) -> Result<String, String> {
    let culprit = |e: &dyn std::fmt::Display| format!("{flag}: {e}");
    let file = std::fs::File::open(path).map_err(|e| culprit(&e))?;
    let mut bytes = Vec::new();
    file.take(limit + 1).read_to_end(&mut bytes).map_err(|e| culprit(&e))?;
    size(bytes.len() as u64)?;
    String::from_utf8(bytes).map_err(|e| culprit(&format!("not UTF-8 text ({e})")))
}

fn check_size(what: &str, bytes: u64) -> Result<(), String> {
    if bytes > MAX_PROMPT_BYTES {
        Err(format!(
            "{what}: the prompt is over {} KiB; the text encoder reads only its first 512 tokens",
            MAX_PROMPT_BYTES >> 10
        ))
    } else {
        Ok(())
    }
}
