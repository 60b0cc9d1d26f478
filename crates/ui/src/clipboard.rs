//! Copying to the user's clipboard through the terminal: OSC 52
//! (`ESC ] 52 ; c ; <base64> BEL`), which xterm, kitty, iTerm2, WezTerm,
//! foot, Windows Terminal and tmux (`set-clipboard on`) take, over ssh
//! too, since it travels in the terminal's own stream. A terminal that
//! ignores it shows nothing, so whoever asks for a copy also shows the
//! text (the footer's message).

/// The OSC 52 sequence that puts `text` on the clipboard (`c`).
pub(crate) fn osc52(text: &str) -> String {
    format!("\x1b]52;c;{}\x07", base64(text.as_bytes()))
}

/// Standard base64 (RFC 4648, with `=` padding). A few lines rather than a
/// dependency: nothing else in the program needs it.
pub(crate) fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        // Three bytes as one 24-bit number, read six bits at a time; a
        // short last chunk gives 2 or 3 characters, padded to 4 with `=`.
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (*b as u32) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ABC[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_of_the_rfc_4648_test_vectors() {
        for (plain, coded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(plain.as_bytes()), coded, "{plain:?}");
        }
        // Every bit of a byte, and the last two letters of the alphabet.
        assert_eq!(base64(&[0xff, 0xfe, 0xfd]), "//79");
        assert_eq!(base64(&[0xfb, 0xef, 0xbe]), "++++");
    }

    #[test]
    fn osc52_of_an_environment_line() {
        assert_eq!(
            osc52("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"),
            "\x1b]52;c;UFlUT1JDSF9DVURBX0FMTE9DX0NPTkY9ZXhwYW5kYWJsZV9zZWdtZW50czpUcnVl\x07"
        );
    }
}
