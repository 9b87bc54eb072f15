//! Where an evicted result goes: `/large_tool_results/{session}/{tool}_{call_id}` (without the
//! session part for a context with no session id), each part sanitized.

use tower_agent_storage::{StorageError, StoragePath};

use crate::segment::segment;

/// The directory of evicted results, as the model sees it.
pub(crate) const DIR: &str = "/large_tool_results";
/// The longest part (tool name or call id) kept as it is, in bytes.
const MAX_PART: usize = 100;

/// The directory of a session's results: [`DIR`], then the session's segment unless its id is
/// empty.
fn session_dir(session: &str) -> String {
    if session.is_empty() {
        DIR.to_owned()
    } else {
        format!("{DIR}/{}", segment(session, MAX_PART))
    }
}

/// What the paths of a session's results start with: its directory and a slash.
pub(crate) fn session_prefix(session: &str) -> String {
    format!("{}/", session_dir(session))
}

/// The path of the result of call `call_id` to tool `tool` in session `session`.
///
/// Each part goes through [`segment`]: mapped to `[A-Za-z0-9_.-]` and, when it had to change
/// or is longer than 100 bytes, shortened with a stable FNV-1a hash of the original appended,
/// so the name is a valid [`StoragePath`] segment under 255 bytes whatever the model wrote.
/// Sessions sharing a backend never share a directory; within a session, call ids are unique,
/// so two calls of one tool never share a path.
pub(crate) fn result_path(
    session: &str,
    tool: &str,
    call_id: &str,
) -> Result<StoragePath, StorageError> {
    StoragePath::parse(&format!(
        "{}/{}_{}",
        session_dir(session),
        segment(tool, MAX_PART),
        segment(call_id, MAX_PART)
    ))
}

/// Whether `path` names a stored result of session `session`: one name right inside its
/// directory, checked. A path of another session is refused.
pub(crate) fn parse_result_path(path: &str, session: &str) -> Option<StoragePath> {
    let parsed = StoragePath::parse(path.trim()).ok()?;
    let dir = session_dir(session);
    let inside = parsed
        .as_str()
        .strip_prefix(&dir[1..])
        .and_then(|rest| rest.strip_prefix('/'))
        .is_some_and(|name| !name.contains('/'));
    inside.then_some(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(tool: &str, id: &str) -> String {
        result_path("", tool, id)
            .expect("valid")
            .as_str()
            .to_owned()
    }

    #[test]
    fn plain_names_are_kept() {
        assert_eq!(name("search", "call_1"), "large_tool_results/search_call_1");
        assert_eq!(name("a.b-c", "X9"), "large_tool_results/a.b-c_X9");
    }

    #[test]
    fn bad_parts_are_mapped_and_hashed() {
        for (tool, id) in [
            ("../../etc", "passwd"),
            ("t", "a/b"),
            ("t", "a\\b"),
            ("t", "a\0b"),
            ("t", "a b"),
            ("t", "日本語"),
            ("t", ".."),
            ("t", "."),
            ("t", ""),
            ("", ""),
            ("t", &"x".repeat(300)),
            (&"é".repeat(300), &"/".repeat(300)),
        ] {
            let path = name(tool, id);
            let segments: Vec<&str> = path.split('/').collect();
            assert_eq!(segments.len(), 2, "{path}");
            assert_eq!(segments[0], "large_tool_results");
            assert!(segments[1].len() <= StoragePath::MAX_SEGMENT, "{path}");
        }
    }

    #[test]
    fn different_ids_never_share_a_path() {
        let ids = [
            "a/b".to_owned(),
            "a_b".to_owned(),
            "a\\b".to_owned(),
            "a b".to_owned(),
            "x".repeat(300),
            format!("{}y", "x".repeat(299)),
            "x".repeat(101),
            "x".repeat(100),
        ];
        let mut paths: Vec<String> = ids.iter().map(|id| name("t", id)).collect();
        paths.sort();
        paths.dedup();
        assert_eq!(paths.len(), ids.len(), "{paths:#?}");
    }

    #[test]
    fn only_result_paths_are_readable() {
        assert!(parse_result_path("/large_tool_results/a_b", "").is_some());
        assert!(parse_result_path("large_tool_results/a_b", "").is_some());
        for bad in [
            "",
            "/",
            "/large_tool_results",
            "/large_tool_results/",
            "/large_tool_results/../secret",
            "/other/a_b",
            "/large_tool_results_x/a",
            "a\\b",
        ] {
            assert!(parse_result_path(bad, "").is_none(), "{bad:?}");
        }
    }

    #[test]
    fn sessions_have_their_own_directory() {
        let path = result_path("s1", "search", "c1").expect("valid");
        assert_eq!(path.as_str(), "large_tool_results/s1/search_c1");
        assert!(parse_result_path("/large_tool_results/s1/search_c1", "s1").is_some());
        // Another session's result, or one outside the session's directory, is refused.
        for bad in [
            "/large_tool_results/s2/search_c1",
            "/large_tool_results/search_c1",
            "/large_tool_results/s1/x/y",
            "/large_tool_results/s1",
        ] {
            assert!(parse_result_path(bad, "s1").is_none(), "{bad:?}");
        }
        // A session id a host made up cannot leave the directory either.
        let odd = result_path("../../etc", "t", "c").expect("valid");
        assert!(odd.as_str().starts_with("large_tool_results/"));
        assert_eq!(odd.segments().count(), 3);
    }
}
