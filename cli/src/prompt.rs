//! The prompt, from `--prompt TEXT` or `--prompt-file FILE` (for prompts
//! longer than a command line may carry, or kept in a file).

use std::io::Read;
use std::path::Path;

/// Prompts above this are refused before tokenizing: the text encoder reads
/// only the first 512 tokens (a few KB of text), so megabytes are a mistake.
pub const MAX_PROMPT_BYTES: u64 = 1 << 20;

/// The prompt the flags give, if any; both at once is an error.
pub fn from_flags(text: Option<&str>, file: Option<&Path>) -> Result<Option<String>, String> {
    match (text, file) {
        (Some(_), Some(_)) => Err("give --prompt or --prompt-file, not both".into()),
        (Some(text), None) => check_size("--prompt", text.len() as u64).map(|()| Some(text.to_owned())),
        (None, Some(path)) => read_file(path).map(Some),
        (None, None) => Ok(None),
    }
}

fn read_file(path: &Path) -> Result<String, String> {
    let culprit = |e: &dyn std::fmt::Display| format!("--prompt-file {}: {e}", path.display());
    let file = std::fs::File::open(path).map_err(|e| culprit(&e))?;
    let mut bytes = Vec::new();
    // One byte past the limit is enough to know it is too long.
    file.take(MAX_PROMPT_BYTES + 1).read_to_end(&mut bytes).map_err(|e| culprit(&e))?;
    check_size(&format!("--prompt-file {}", path.display()), bytes.len() as u64)?;
    let text = String::from_utf8(bytes).map_err(|e| culprit(&format!("not UTF-8 text ({e})")))?;
    // A file's final line break is not part of the prompt.
    Ok(text.strip_suffix('\n').map(|t| t.strip_suffix('\r').unwrap_or(t)).unwrap_or(&text).to_owned())
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
