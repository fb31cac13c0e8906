//! Text taken from data (a node type, a host name, a model's name, a watchdog's
//! message, a folder's name) on its way to a medium that acts on some characters: one
//! function per medium, which every writer to that medium calls on such text. A
//! terminal acts on control characters (an escape sequence can set the window's title,
//! clear the screen or move the cursor), and a Markdown viewer renders HTML and splits
//! table cells at `|`. A leaf: it uses nothing else in the crate.

use std::borrow::Cow;
use std::fmt::Write;

/// Whether a terminal acts on `c`: a C0 control, DEL, a C1 control, or a character that
/// reorders the text around it (the bidirectional overrides and isolates).
fn acts_on_terminal(c: char) -> bool {
    c.is_control() || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// Writes `c` as text: `\x1b` for a C0 control or DEL, `\u{202e}` for the others.
fn push_escaped(out: &mut String, c: char) {
    if (c as u32) < 0x80 {
        let _ = write!(out, "\\x{:02x}", c as u32);
    } else {
        let _ = write!(out, "\\u{{{:x}}}", c as u32);
    }
}

/// `text` for a terminal: every character a terminal acts on written as its escape
/// (`\x1b`, `\x07`, `\u{9b}`, `\u{202e}`), line breaks kept (callers pass whole lines of
/// output as well as single fields), the rest as it is.
pub(crate) fn terminal(text: &str) -> Cow<'_, str> {
    if !text.chars().any(|c| c != '\n' && acts_on_terminal(c)) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c != '\n' && acts_on_terminal(c) {
            push_escaped(&mut out, c);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// `text` for Markdown (report.md, compare.md), as one line or one table cell: `&`, `<`
/// and `>` as HTML entities (no tag, no entity of the data's is rendered), `|` as `\|`
/// (no cell is split), and every character [`terminal`] escapes (a line break too)
/// escaped the same way, for a file read in a terminal.
pub(crate) fn markdown(text: &str) -> Cow<'_, str> {
    let special = |c: char| matches!(c, '&' | '<' | '>' | '|') || acts_on_terminal(c);
    if !text.chars().any(special) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '|' => out.push_str("\\|"),
            c if acts_on_terminal(c) => push_escaped(&mut out, c),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_terminal_gets_no_control_character_of_the_data() {
        let planted = "V100\x1b]0;pwned\x07\x1b[2J node\u{9b}31m\u{202e}";
        let shown = terminal(planted);
        assert!(!shown.chars().any(|c| c.is_control()), "{shown:?}");
        assert_eq!(shown, "V100\\x1b]0;pwned\\x07\\x1b[2J node\\u{9b}31m\\u{202e}");
        assert_eq!(terminal("two\nlines, é"), "two\nlines, é");
        assert!(matches!(terminal("plain"), Cow::Borrowed(_)));
    }

    #[test]
    fn markdown_gets_no_tag_and_no_cell_break_of_the_data() {
        assert_eq!(
            markdown("<script>alert(1)</script> a|b & c\n\x1b[2J"),
            "&lt;script&gt;alert(1)&lt;/script&gt; a\\|b &amp; c\\x0a\\x1b[2J"
        );
        assert_eq!(markdown("Intel(R) Xeon(R) 2c 24GiB"), "Intel(R) Xeon(R) 2c 24GiB");
    }
}
