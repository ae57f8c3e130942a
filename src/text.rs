//! Echoing what a user or an admin typed back in an error message.
//!
//! A message must name the bad input, but a 5,000-character option value
//! echoed in full buries the message (and fills logs): keep the head.

/// Characters of a value kept in messages.
pub const SHOWN_CHARS: usize = 64;

/// `value` as an error message shows it: whole when short, else its first
/// [`SHOWN_CHARS`] characters and its length, e.g. `aaaa… (5000 bytes)`.
pub fn shorten(value: &str) -> String {
    match value.char_indices().nth(SHOWN_CHARS) {
        None => value.to_string(),
        Some((cut, _)) => format!("{}… ({} bytes)", &value[..cut], value.len()),
    }
}

/// `value` safe to print on a terminal: each control character (a line
/// break, ESC starting a terminal sequence, …) shown as its escape
/// (`\n`, `\u{1b}`), so a job name cannot move the cursor, recolour the
/// screen or forge a line of a table it appears in.
pub fn printable(value: &str) -> std::borrow::Cow<'_, str> {
    if !value.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(value);
    }
    std::borrow::Cow::Owned(
        value
            .chars()
            .map(|c| {
                if c.is_control() {
                    c.escape_default().to_string()
                } else {
                    c.to_string()
                }
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_print_as_their_escapes() {
        for (value, shown) in [
            ("train-x", "train-x"),
            ("a\nJOB 1 forged", "a\\nJOB 1 forged"),
            ("\u{1b}]0;title\u{7}x", "\\u{1b}]0;title\\u{7}x"),
            ("tab\there", "tab\\there"),
            ("naïve", "naïve"),
        ] {
            assert_eq!(printable(value), shown, "{value:?}");
        }
    }

    #[test]
    fn short_values_are_whole_and_long_ones_cut_with_their_length() {
        struct Case {
            name: &'static str,
            value: String,
            shown: String,
        }
        let cases = [
            Case {
                name: "short",
                value: "bogus".into(),
                shown: "bogus".into(),
            },
            Case {
                name: "exactly the limit",
                value: "a".repeat(64),
                shown: "a".repeat(64),
            },
            Case {
                name: "huge",
                value: "a".repeat(5000),
                shown: format!("{}… (5000 bytes)", "a".repeat(64)),
            },
            Case {
                name: "multi-byte characters are not split",
                value: "é".repeat(100),
                shown: format!("{}… (200 bytes)", "é".repeat(64)),
            },
        ];
        for c in cases {
            assert_eq!(shorten(&c.value), c.shown, "{}", c.name);
        }
    }
}
