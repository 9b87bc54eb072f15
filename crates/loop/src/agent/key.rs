//! The key of each logical call ([`ToolCall::key`](tower_agent_core::ToolCall::key)).

/// The key of the call `call_id` of `round` in the run `run_id`: the
/// same wherever it is derived again (an early start and its adoption, a replay of the run
/// under the same id), another for every other call. Within a round, call ids are unique.
pub(super) fn call_key(run_id: &str, round: u32, call_id: &str) -> String {
    let name = format!("{run_id}\n{round}\n{call_id}");
    uuid::Uuid::new_v5(&KEYS, name.as_bytes()).to_string()
}

/// The namespace of call keys (a UUID of its own, so keys collide with no other v5 UUIDs).
const KEYS: uuid::Uuid = uuid::Uuid::from_u128(0x6d1f_2a0c_4b7e_5c11_9a3d_0e8f_7b24_c6a5);
