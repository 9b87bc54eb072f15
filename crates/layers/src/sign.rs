//! Keyed hashes (HMAC-SHA-256): the redaction's hashed values and the approval's tokens.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// HMAC-SHA-256 of `message` under `key`, its first `bytes` bytes (at most 32) in hex.
pub(crate) fn hmac_hex(key: &[u8], message: &[u8], bytes: usize) -> String {
    // HMAC takes a key of any length: this cannot fail.
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(key) else {
        return String::new();
    };
    mac.update(message);
    let digest = mac.finalize().into_bytes();
    digest
        .iter()
        .take(bytes)
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

#[cfg(feature = "approval")]
/// Whether `tag` (hex) is the whole HMAC-SHA-256 of `message` under `key`, compared in
/// constant time.
pub(crate) fn hmac_verify(key: &[u8], message: &[u8], tag: &str) -> bool {
    let Some(tag) = unhex(tag) else { return false };
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(key) else {
        return false;
    };
    mac.update(message);
    mac.verify_slice(&tag).is_ok()
}

#[cfg(feature = "approval")]
fn unhex(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 || !text.is_ascii() {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(&text[at..at + 2], 16).ok())
        .collect()
}
