//! The crates' version is the CHANGELOG's latest release (the workspace's crates all have it:
//! they take it from the workspace, which cargo holds them to).

#[test]
fn the_version_is_the_changelogs_latest_release() {
    let changelog = include_str!("../CHANGELOG.md");
    let latest = changelog
        .lines()
        .filter_map(|line| line.strip_prefix("## ["))
        .filter_map(|rest| rest.split(']').next())
        .find(|name| *name != "Unreleased")
        .expect("a released version in the CHANGELOG");
    assert_eq!(latest, env!("CARGO_PKG_VERSION"));
}
