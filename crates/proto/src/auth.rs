//! Shared-secret challenge–response authentication.
//!
//! Both peers hold the same 32-byte token. On connect the server sends a random nonce; the client
//! answers with its own nonce and `HMAC-SHA256(token, "gleaner/1 client" ‖ server nonce ‖ client
//! nonce ‖ session id ‖ session key)`; the server answers with `HMAC-SHA256(token, "gleaner/1
//! server" ‖ client nonce ‖ server nonce ‖ session id)`. Each side thus proves it holds the token,
//! the token itself never crosses the wire, and a recorded exchange cannot be replayed because each
//! side contributes a fresh nonce.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Length of the per-session attach key handed out in `Welcome`.
pub const SESSION_KEY_LEN: usize = 16;
/// A random key that, with the session id, lets further connections attach to a session.
pub type SessionKey = [u8; SESSION_KEY_LEN];

/// Length of the shared token in bytes (stored as 64 hex digits).
pub const TOKEN_LEN: usize = 32;
/// Length of a handshake nonce.
pub const NONCE_LEN: usize = 32;
/// Length of an HMAC-SHA256 proof.
pub const PROOF_LEN: usize = 32;

/// The shared secret.
pub type Token = [u8; TOKEN_LEN];
/// A handshake nonce.
pub type Nonce = [u8; NONCE_LEN];
/// An HMAC proof of holding the token.
pub type Proof = [u8; PROOF_LEN];

fn mac(token: &Token, parts: &[&[u8]]) -> Proof {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(token).expect("HMAC takes any key length");
    for p in parts {
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

/// The proof a client sends in `Auth`.
pub fn client_proof(
    token: &Token,
    server_nonce: &Nonce,
    client_nonce: &Nonce,
    session_id: u64,
    session_key: &SessionKey,
) -> Proof {
    mac(
        token,
        &[
            b"gleaner/1 client",
            server_nonce,
            client_nonce,
            &session_id.to_le_bytes(),
            session_key,
        ],
    )
}

/// The proof a server sends in `Welcome`.
pub fn server_proof(
    token: &Token,
    server_nonce: &Nonce,
    client_nonce: &Nonce,
    session_id: u64,
) -> Proof {
    mac(
        token,
        &[
            b"gleaner/1 server",
            client_nonce,
            server_nonce,
            &session_id.to_le_bytes(),
        ],
    )
}

/// Compares two proofs in constant time.
pub fn proofs_equal(a: &Proof, b: &Proof) -> bool {
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

/// Fills `N` bytes from the operating system's random source.
pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    getrandom::getrandom(&mut b).expect("the OS random source is available");
    b
}

/// A fresh random token.
pub fn generate_token() -> Token {
    random_bytes()
}

/// Writes `token` as hex to `path`, created (or truncated) readable and writable by its owner only.
pub fn write_token_file(path: &Path, token: &Token) -> io::Result<()> {
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    // An existing file keeps its old mode on open: force owner-only.
    f.set_permissions(fs::Permissions::from_mode(0o600))?;
    writeln!(f, "{}", to_hex(token))?;
    f.sync_all()
}

/// Reads a token written by [`write_token_file`] (64 hex digits, surrounding whitespace ignored).
///
/// Refuses a file that group or others may read, as ssh does for private keys.
pub fn read_token_file(path: &Path) -> io::Result<Token> {
    read_secret_file(path, "token")
}

/// Reads a 32-byte secret (a token, a page key) kept as 64 hex digits in a file only its owner
/// may read; `what` names the secret in errors.
pub fn read_secret_file(path: &Path, what: &str) -> io::Result<[u8; TOKEN_LEN]> {
    let meta = fs::metadata(path)?;
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{what} file {} is accessible by group or others (mode {:o}); run `chmod 600 {}`",
                path.display(),
                meta.permissions().mode() & 0o777,
                path.display()
            ),
        ));
    }
    // In a window (`gleaner_fds::making`): a pager reads it again when it reconnects.
    let text = gleaner_fds::read_to_string(path)?;
    parse_hex_token(text.trim()).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{what} file {} does not hold a {what} ({} hex digits expected)",
                path.display(),
                TOKEN_LEN * 2
            ),
        )
    })
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_hex_token(s: &str) -> Option<Token> {
    if s.len() != TOKEN_LEN * 2 || !s.is_ascii() {
        return None;
    }
    let mut t = [0u8; TOKEN_LEN];
    for (i, out) in t.iter_mut().enumerate() {
        *out = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_depend_on_every_input() {
        let t = [1u8; 32];
        let base = client_proof(&t, &[2; 32], &[3; 32], 4, &[5; 16]);
        assert_ne!(
            base,
            client_proof(&[9; 32], &[2; 32], &[3; 32], 4, &[5; 16])
        );
        assert_ne!(base, client_proof(&t, &[9; 32], &[3; 32], 4, &[5; 16]));
        assert_ne!(base, client_proof(&t, &[2; 32], &[9; 32], 4, &[5; 16]));
        assert_ne!(base, client_proof(&t, &[2; 32], &[3; 32], 9, &[5; 16]));
        assert_ne!(base, client_proof(&t, &[2; 32], &[3; 32], 4, &[9; 16]));
        // The server's proof can never be replayed as a client's and vice versa.
        assert_ne!(base, server_proof(&t, &[2; 32], &[3; 32], 4));
        assert!(proofs_equal(&base, &base));
        assert!(!proofs_equal(&base, &[0; 32]));
    }

    #[test]
    fn token_file_round_trip_and_permissions() {
        let dir = std::env::temp_dir().join(format!("gleaner-token-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("token");
        let t = generate_token();
        write_token_file(&path, &t).unwrap();
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(read_token_file(&path).unwrap(), t);
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let err = read_token_file(&path).unwrap_err();
        assert!(err.to_string().contains("chmod 600"), "{err}");
        fs::write(&path, "not hex").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        assert!(read_token_file(&path).is_err());
        fs::remove_dir_all(&dir).unwrap();
    }
}
