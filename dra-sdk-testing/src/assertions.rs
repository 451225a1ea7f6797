//! Assertions the tests of every crate share.

/// Asserts that `text` contains `expected`, printing the whole text when it does not: the
/// check most tests make on an error message or a rendered document.
///
/// ```
/// dra_sdk_testing::assert_contains("claim default/gpu not found", "not found");
/// ```
#[track_caller]
pub fn assert_contains(text: impl AsRef<str>, expected: impl AsRef<str>) {
    let (text, expected) = (text.as_ref(), expected.as_ref());
    assert!(text.contains(expected), "expected {expected:?} in:\n{text}");
}
