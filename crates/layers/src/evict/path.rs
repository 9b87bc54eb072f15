//! Where an evicted result goes: `/large_tool_results/{tool}_{call_id}`, each part sanitized.

use tower_agent_storage::{StorageError, StoragePath};

use crate::segment::segment;

/// The directory of evicted results, as the model sees it.
pub(crate) const DIR: &str = "/large_tool_results";
/// [`DIR`] as the first segment of a [`StoragePath`].
pub(crate) const SEGMENT: &str = "large_tool_results";

/// The longest part (tool name or call id) kept as it is, in bytes.
const MAX_PART: usize = 100;

/// The path of the result of call `call_id` to tool `tool`.
///
/// Each part goes through [`segment`]: mapped to `[A-Za-z0-9_.-]` and, when it had to change
/// or is longer than 100 bytes, shortened with a stable FNV-1a hash of the original appended,
/// so the name is a valid [`StoragePath`] segment under 255 bytes whatever the model wrote,
/// and two different ids never share a path.
pub(crate) fn result_path(tool: &str, call_id: &str) -> Result<StoragePath, StorageError> {
    StoragePath::parse(&format!(
        "{DIR}/{}_{}",
        segment(tool, MAX_PART),
        segment(call_id, MAX_PART)
    ))
}

/// Whether `path` names a stored result: `/large_tool_results/<name>`, checked.
pub(crate) fn parse_result_path(path: &str) -> Option<StoragePath> {
    let parsed = StoragePath::parse(path.trim()).ok()?;
    let inside = {
        let mut segments = parsed.segments();
        segments.next() == Some(SEGMENT) && segments.next().is_some()
    };
    inside.then_some(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(tool: &str, id: &str) -> String {
        result_path(tool, id).expect("valid").as_str().to_owned()
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
            assert_eq!(segments[0], SEGMENT);
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
        assert!(parse_result_path("/large_tool_results/a_b").is_some());
        assert!(parse_result_path("large_tool_results/a_b").is_some());
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
            assert!(parse_result_path(bad).is_none(), "{bad:?}");
        }
    }
}
