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

#[cfg(test)]
mod tests {
    use super::*;

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
