//! The WGSL text the rewriting reads: statements, calls, brackets and
//! names, found by scanning, not by parsing the whole module.

use std::collections::BTreeMap;

/// `let NAME = EXPR` or `var NAME = EXPR` (declared) or `NAME = EXPR`.
pub(super) fn assignment(statement: &str) -> Result<(bool, &str, &str), String> {
    let (declared, rest) = match statement.strip_prefix("let ").or_else(|| statement.strip_prefix("var ")) {
        Some(rest) => (true, rest),
        None => (false, statement),
    };
    let (name, expr) = rest.split_once('=').ok_or_else(|| format!("`{statement}`: a cooperative call outside an assignment, a store or a return"))?;
    let name = name.trim();
    if !is_identifier(name) {
        return Err(format!("`{statement}`: a tile assigned to `{name}`, not a name"));
    }
    Ok((declared, name, expr.trim()))
}

/// The `;` ending the statement that holds the call at `at`.
pub(super) fn statement_end(text: &str, at: usize) -> Result<usize, String> {
    let mut depth = 0i32;
    for (i, c) in text[at..].char_indices() {
        match c {
            '(' | '[' => depth += 1,
            ')' | ']' => depth -= 1,
            ';' if depth == 0 => return Ok(at + i),
            _ => {}
        }
    }
    Err("a cooperative call in an unfinished statement".into())
}

/// The first cooperative call in `text`.
pub(super) fn first_call(text: &str) -> Option<(usize, &'static str)> {
    super::CALLS.iter().filter_map(|call| find_whole(text, call).map(|at| (at, *call))).min_by_key(|(at, _)| *at)
}

/// Where `word` first stands alone in `text`.
pub(super) fn find_whole(text: &str, word: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = text[from..].find(word) {
        let at = from + i;
        from = at + word.len();
        let alone = !text[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_') && !text[from..].starts_with(|c: char| c.is_alphanumeric() || c == '_');
        if alone {
            return Some(at);
        }
    }
    None
}

/// The array and index a pointer argument names: `&ARRAY[INDEX]`, or a
/// name bound by a pointer `let`.
pub(super) fn pointed(pointer: &str, pointers: &BTreeMap<String, String>) -> Result<(String, String), String> {
    let pointer = pointer.trim();
    if let Some(array) = pointers.get(pointer) {
        return Ok((array.clone(), pointer.to_string()));
    }
    let inner = pointer.strip_prefix('&').ok_or_else(|| format!("a cooperative pointer `{pointer}` that is not `&array[index]`"))?;
    let open = inner.find('[').ok_or_else(|| format!("a cooperative pointer `{pointer}` without an index"))?;
    let close = matching(inner, open, '[', ']')?;
    if close + 1 != inner.len() {
        return Err(format!("a cooperative pointer `{pointer}` into more than an array element"));
    }
    Ok((inner[..open].trim().to_string(), inner[open + 1..close].to_string()))
}

/// The index of the bracket closing the one at `open`.
pub(super) fn matching(text: &str, open: usize, opening: char, closing: char) -> Result<usize, String> {
    let mut depth = 0usize;
    for (i, c) in text[open..].char_indices() {
        if c == opening {
            depth += 1;
        } else if c == closing {
            depth -= 1;
            if depth == 0 {
                return Ok(open + i);
            }
        }
    }
    Err(format!("an unclosed `{opening}`"))
}

/// A call's arguments, split at the commas outside any bracket.
pub(super) fn split_arguments(args: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut current = String::new();
    for c in args.chars() {
        match c {
            '(' | '[' => depth += 1,
            ')' | ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(current.trim().to_string());
                current.clear();
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    if !current.trim().is_empty() {
        out.push(current.trim().to_string());
    }
    out
}

pub(super) fn is_identifier(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_alphanumeric() || c == '_') && !s.starts_with(|c: char| c.is_ascii_digit())
}
