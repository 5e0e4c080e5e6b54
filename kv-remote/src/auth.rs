//! Mutual proof of the token, without sending it.
//!
//! A client that holds the token sends a random 32-byte nonce to the
//! agent's `AgentAuth.Challenge`; the agent answers with its own nonce and
//! `HMAC-SHA256(token, PROOF | client nonce | agent nonce)`. The client
//! checks that proof before it sends anything else, so an endpoint that
//! does not know the token (another program on the port, an agent with
//! another token) learns nothing and gets no call. Every later call then
//! carries `authorization: Session <client nonce>.<agent nonce>.<mac>`
//! (hex), where `mac = HMAC-SHA256(token, SESSION | client nonce | agent
//! nonce)`: the token itself never crosses the connection.
//!
//! The agent keeps no table of sessions (so a flood of challenges evicts
//! nothing): its nonce is 16 random bytes and a 16-byte tag,
//! `HMAC-SHA256(agent key, random | client nonce)`, under a key drawn when
//! the agent starts. A session is good for that agent process only: a
//! credential seen on the wire opens no other agent that shares the token,
//! and none after a restart. (It can be replayed to the same agent by
//! whoever sees it: across hosts, tunnel the connection through TLS.)

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Labels keep a proof from being usable as a session, and the reverse.
const PROOF: &[u8] = b"kvsds agent proof v2";
const SESSION: &[u8] = b"kvsds session v2";
/// Bytes of each nonce.
pub(crate) const NONCE: usize = 32;
/// The scheme of a session credential in `authorization`.
pub(crate) const SCHEME: &str = "Session ";

fn mac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    // HMAC takes a key of any length; `new_from_slice` cannot fail for it.
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).unwrap_or_else(|_| unreachable!("HMAC takes any key"));
    for p in parts {
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

/// Equal without an early exit.
pub(crate) fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `N` bytes from the operating system's generator.
pub(crate) fn random<const N: usize>() -> Result<[u8; N], String> {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).map_err(|e| format!("random bytes: {e}"))?;
    Ok(b)
}

fn hex(b: &[u8]) -> String {
    const D: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(b.len() * 2);
    for x in b {
        s.push(D[usize::from(x >> 4)] as char);
        s.push(D[usize::from(x & 15)] as char);
    }
    s
}

fn unhex<const N: usize>(s: &str) -> Option<[u8; N]> {
    let s = s.as_bytes();
    if s.len() != 2 * N {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = digit(s[2 * i])? << 4 | digit(s[2 * i + 1])?;
    }
    Some(out)
}

/// The agent's side: its token and the key its nonces are tagged with.
pub(crate) struct AgentKeys {
    token: Vec<u8>,
    key: [u8; 32],
}

impl std::fmt::Debug for AgentKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AgentKeys { .. }")
    }
}

impl AgentKeys {
    pub(crate) fn new(token: &str) -> Result<Self, String> {
        Ok(AgentKeys { token: token.as_bytes().to_vec(), key: random()? })
    }

    /// Answers a challenge: the agent's nonce and its proof.
    pub(crate) fn answer(&self, client_nonce: &[u8]) -> Result<([u8; NONCE], [u8; 32]), String> {
        if client_nonce.len() != NONCE {
            return Err(format!("client_nonce: {} bytes, want {NONCE}", client_nonce.len()));
        }
        let r: [u8; 16] = random()?;
        let mut nonce = [0u8; NONCE];
        nonce[..16].copy_from_slice(&r);
        nonce[16..].copy_from_slice(&mac(&self.key, &[&r, client_nonce])[..16]);
        Ok((nonce, mac(&self.token, &[PROOF, client_nonce, &nonce])))
    }

    /// Whether `value` (what follows `Session `) is a session this agent
    /// opened with a client that knows the token.
    pub(crate) fn admits(&self, value: &str) -> bool {
        let mut parts = value.split('.');
        let (Some(c), Some(a), Some(m), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
            return false;
        };
        let (Some(c), Some(a), Some(m)) = (unhex::<NONCE>(c), unhex::<NONCE>(a), unhex::<32>(m)) else {
            return false;
        };
        let tag = mac(&self.key, &[&a[..16], &c]);
        // Both checks always run: no early exit to time.
        let ours = same(&tag[..16], &a[16..]);
        let knows = same(&mac(&self.token, &[SESSION, &c, &a]), &m);
        ours & knows
    }
}

/// The client's side of one challenge.
pub(crate) struct Challenge {
    nonce: [u8; NONCE],
}

impl Challenge {
    pub(crate) fn new() -> Result<Self, String> {
        Ok(Challenge { nonce: random()? })
    }

    pub(crate) fn nonce(&self) -> &[u8] {
        &self.nonce
    }

    /// Checks the agent's proof; on success, the `authorization` value of
    /// every later call.
    pub(crate) fn session(&self, token: &str, agent_nonce: &[u8], proof: &[u8]) -> Option<String> {
        if agent_nonce.len() != NONCE || !same(&mac(token.as_bytes(), &[PROOF, &self.nonce, agent_nonce]), proof) {
            return None;
        }
        let m = mac(token.as_bytes(), &[SESSION, &self.nonce, agent_nonce]);
        Some(format!("{SCHEME}{}.{}.{}", hex(&self.nonce), hex(agent_nonce), hex(&m)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(agent: &AgentKeys, token: &str) -> Option<String> {
        let c = Challenge::new().unwrap();
        let (n, p) = agent.answer(c.nonce()).unwrap();
        c.session(token, &n, &p)
    }

    #[test]
    fn hmac_sha256_matches_rfc_4231_case_2() {
        let m = mac(b"Jefe", &[b"what do ya want ", b"for nothing?"]);
        assert_eq!(hex(&m), "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
        assert_eq!(unhex::<32>(&hex(&m)), Some(m));
        assert_eq!(unhex::<2>("0G00"), None);
    }

    #[test]
    fn a_session_opens_the_agent_that_issued_it_only() {
        let a = AgentKeys::new("tok").unwrap();
        let s = session(&a, "tok").expect("the agent proves it knows the token");
        let v = s.strip_prefix(SCHEME).unwrap();
        assert!(a.admits(v));
        // Another agent with the same token: the nonce is not its own.
        assert!(!AgentKeys::new("tok").unwrap().admits(v));
        // One flipped digit anywhere.
        for i in [0, 70, v.len() - 1] {
            let mut b = v.as_bytes().to_vec();
            b[i] = if b[i] == b'0' { b'1' } else { b'0' };
            assert!(!a.admits(std::str::from_utf8(&b).unwrap()), "digit {i}");
        }
        assert!(!a.admits(""));
        assert!(!a.admits(&format!("{v}.00")));
    }

    #[test]
    fn an_agent_with_another_token_cannot_prove_itself() {
        assert!(session(&AgentKeys::new("other").unwrap(), "tok").is_none());
        // Nor can a proof be replayed for a fresh challenge.
        let a = AgentKeys::new("tok").unwrap();
        let c1 = Challenge::new().unwrap();
        let (n, p) = a.answer(c1.nonce()).unwrap();
        assert!(c1.session("tok", &n, &p).is_some());
        assert!(Challenge::new().unwrap().session("tok", &n, &p).is_none());
        assert!(a.answer(&[0u8; 5]).is_err());
    }
}
