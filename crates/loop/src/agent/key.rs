//! The key of each logical call ([`ToolCall::key`](tower_agent_core::ToolCall::key)).

use tower_agent_core::CallKey;
use uuid::Uuid;

/// The keys of one run's calls. The run's base is a UUID derived from its id (the same base
/// for a replay under the same id, another for every other run); a call's key is the base with
/// the call's round and its position in its message folded into the last 64 bits. So the key
/// is the same wherever it is derived again (an early start and its adoption, a replay), and
/// another for every other call of the run. Deriving the base hashes once per run; a key
/// costs a XOR.
#[derive(Debug, Clone, Copy)]
pub(super) struct CallKeys(u128);

impl CallKeys {
    /// The keys of the run `run_id`.
    pub(super) fn of_run(run_id: &str) -> Self {
        Self(Uuid::new_v5(&KEYS, run_id.as_bytes()).as_u128())
    }

    /// The key of the call at `position` in the message of `round`.
    pub(super) fn key(self, round: u32, position: usize) -> CallKey {
        // A message has fewer than 2^32 calls; a run fewer than 2^30 rounds, so the UUID's
        // version and variant bits are left as they are.
        let position = u32::try_from(position).unwrap_or(u32::MAX);
        let spot = (u128::from(round) << 32) | u128::from(position);
        CallKey::from_u128(self.0 ^ spot)
    }
}

/// The namespace of the runs' bases (a UUID of its own, so they collide with no other v5
/// UUIDs).
const KEYS: Uuid = Uuid::from_u128(0x6d1f_2a0c_4b7e_5c11_9a3d_0e8f_7b24_c6a5);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_differ_by_run_round_and_position_and_repeat_for_the_same() {
        let run = CallKeys::of_run("run-1");
        let keys = [run.key(1, 0), run.key(1, 1), run.key(2, 0), run.key(2, 1)];
        for (i, a) in keys.iter().enumerate() {
            for b in &keys[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert_eq!(
            CallKeys::of_run("run-1").key(2, 1),
            keys[3],
            "derived again"
        );
        assert_ne!(CallKeys::of_run("run-2").key(1, 0), keys[0], "another run");
        let version = |key: CallKey| Uuid::from_u128(key.as_u128()).get_version_num();
        assert_eq!(version(run.key(7, 3)), 5);
    }
}
