//! Text fields of an access line, made safe for either log format: every byte outside
//! printable ASCII, and the space, `"`, `\` and `%`, percent-encoded (so a field is one word
//! of one line, and nothing a client sends can end a line, fake a field or carry terminal
//! escapes), and cut past a length, marked with the length it had.

use std::{borrow::Cow, fmt::Write as _};

/// `text` escaped, at most `max` bytes of it (then `…` and its length in bytes).
pub fn field(text: &str, max: usize) -> Cow<'_, str> {
    let cut = text.len() > max;
    if !cut && text.bytes().all(is_plain) {
        return Cow::Borrowed(text);
    }
    let mut end = max.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = String::with_capacity(end + 16);
    for byte in text[..end].bytes() {
        if is_plain(byte) {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    if cut {
        let _ = write!(out, "…({} bytes)", text.len());
    }
    Cow::Owned(out)
}

fn is_plain(byte: u8) -> bool {
    byte.is_ascii_graphic() && !matches!(byte, b'"' | b'\\' | b'%')
}

#[cfg(test)]
mod tests;
