//! The outcome of a conformance run: one entry per case, printable as a table, as JSON, or
//! asserted in a test.

use std::fmt;
use std::time::Duration;

use serde::Serialize;

/// How one case ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", content = "message", rename_all = "lowercase")]
pub enum Outcome {
    /// Every check of the case held.
    Passed,
    /// A check failed; the message says which and why.
    Failed(String),
    /// The case could not run against this target; the reason says what is missing.
    Skipped(String),
}

impl Outcome {
    /// `passed`, `FAILED` or `skipped`, as the table prints it.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Passed => "passed",
            Outcome::Failed(_) => "FAILED",
            Outcome::Skipped(_) => "skipped",
        }
    }

    /// Whether the case failed.
    pub fn is_failed(&self) -> bool {
        matches!(self, Outcome::Failed(_))
    }
}

/// The result of one case.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct CaseReport {
    /// The case's stable name, e.g. `prepare-idempotent`.
    pub name: &'static str,
    /// What the case proves, in one line.
    pub description: &'static str,
    /// How it ended.
    #[serde(flatten)]
    pub outcome: Outcome,
    /// How long it ran.
    #[serde(rename = "durationMs", serialize_with = "millis")]
    pub duration: Duration,
    /// Observations that did not fail the case (timings, checks left out and why).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

fn millis<S: serde::Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_f64(duration.as_secs_f64() * 1000.0)
}

/// The results of a conformance run, in the order the cases ran.
///
/// `Display` prints a table; [`Report::assert_passed`] turns failures into a test failure.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Report {
    /// Which suite ran: `conformance` or `e2e`.
    pub suite: &'static str,
    /// The driver name the plugin registered.
    pub driver: String,
    /// What was tested: `in-process` or the registration socket.
    pub target: String,
    /// One entry per case.
    pub cases: Vec<CaseReport>,
}

impl Report {
    /// Whether no case failed (skipped cases do not count as failures).
    pub fn passed(&self) -> bool {
        !self.cases.iter().any(|case| case.outcome.is_failed())
    }

    /// The failed cases.
    pub fn failures(&self) -> impl Iterator<Item = &CaseReport> {
        self.cases.iter().filter(|case| case.outcome.is_failed())
    }

    /// The case with this name, if it ran.
    pub fn case(&self, name: &str) -> Option<&CaseReport> {
        self.cases.iter().find(|case| case.name == name)
    }

    /// Panics with the failed cases and their messages, and the whole table, if any case
    /// failed. For `#[tokio::test]`s.
    ///
    /// ```should_panic
    /// use dra_sdk_testing::conformance::{Outcome, Report};
    ///
    /// let mut report = Report::new("gpu.example.com", "in-process");
    /// report.push("cdi-specs", "CDI spec files", Outcome::Failed("left behind".into()));
    /// report.assert_passed();
    /// ```
    #[track_caller]
    pub fn assert_passed(&self) {
        if self.passed() {
            return;
        }
        let mut message = format!("{} failures:\n", self.suite);
        for case in self.failures() {
            if let Outcome::Failed(why) = &case.outcome {
                message.push_str(&format!("  {}: {why}\n", case.name));
            }
        }
        message.push('\n');
        message.push_str(&self.to_string());
        panic!("{message}");
    }

    /// Like [`assert_passed`](Self::assert_passed), and also panics when a case was skipped:
    /// for a target that must run every case.
    #[track_caller]
    pub fn assert_all_passed(&self) {
        self.assert_passed();
        let skipped: Vec<String> = self
            .cases
            .iter()
            .filter_map(|case| match &case.outcome {
                Outcome::Skipped(why) => Some(format!("  {}: {why}", case.name)),
                _ => None,
            })
            .collect();
        assert!(
            skipped.is_empty(),
            "{} cases skipped:\n{}\n\n{self}",
            self.suite,
            skipped.join("\n")
        );
    }

    /// An empty report, for building one by hand (tests of report consumers).
    pub fn new(driver: impl Into<String>, target: impl Into<String>) -> Self {
        Self {
            suite: "conformance",
            driver: driver.into(),
            target: target.into(),
            cases: Vec::new(),
        }
    }

    /// Appends a case that took no time and has no notes.
    pub fn push(&mut self, name: &'static str, description: &'static str, outcome: Outcome) {
        self.cases.push(CaseReport {
            name,
            description,
            outcome,
            duration: Duration::ZERO,
            notes: Vec::new(),
        });
    }

    fn counts(&self) -> (usize, usize, usize) {
        self.cases
            .iter()
            .fold((0, 0, 0), |(passed, failed, skipped), case| {
                match case.outcome {
                    Outcome::Passed => (passed + 1, failed, skipped),
                    Outcome::Failed(_) => (passed, failed + 1, skipped),
                    Outcome::Skipped(_) => (passed, failed, skipped + 1),
                }
            })
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} of {} ({})", self.suite, self.driver, self.target)?;
        let width = self
            .cases
            .iter()
            .map(|case| case.name.len())
            .max()
            .unwrap_or(4)
            .max(4);
        writeln!(
            f,
            "  {:<width$}  {:<7}  {:>8}  DETAILS",
            "CASE", "RESULT", "TIME"
        )?;
        for case in &self.cases {
            let detail = match &case.outcome {
                Outcome::Passed => case.description,
                Outcome::Failed(message) | Outcome::Skipped(message) => message.as_str(),
            };
            let time = format!("{:.0} ms", case.duration.as_secs_f64() * 1000.0);
            writeln!(
                f,
                "  {:<width$}  {:<7}  {:>8}  {}",
                case.name,
                case.outcome.label(),
                time,
                one_line(detail)
            )?;
            for note in &case.notes {
                writeln!(
                    f,
                    "  {:<width$}  {:<7}  {:>8}  note: {}",
                    "",
                    "",
                    "",
                    one_line(note)
                )?;
            }
        }
        let (passed, failed, skipped) = self.counts();
        write!(f, "{passed} passed, {failed} failed, {skipped} skipped")
    }
}

/// Messages may carry newlines (multi-problem lists); the table keeps one row per line.
fn one_line(text: &str) -> String {
    text.split('\n')
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Report {
        let mut report = Report::new("gpu.example.com", "in-process");
        report.push("registration", "GetInfo answers", Outcome::Passed);
        report.push(
            "restart-keeps-claims",
            "restart",
            Outcome::Skipped("needs an in-process target".into()),
        );
        report.push(
            "cdi-specs",
            "CDI specs",
            Outcome::Failed("spec a.json left\nspec b.json left".into()),
        );
        report.cases[0]
            .notes
            .push("GetInfo took 1 ms at most".into());
        report
    }

    #[test]
    fn table_lists_every_case_on_one_line() {
        let text = sample().to_string();
        assert!(
            text.starts_with("conformance of gpu.example.com (in-process)"),
            "{text}"
        );
        assert!(text.contains("registration          passed"), "{text}");
        assert!(text.contains("note: GetInfo took 1 ms at most"), "{text}");
        assert!(
            text.contains("FAILED") && text.contains("spec a.json left | spec b.json left"),
            "{text}"
        );
        assert!(text.ends_with("1 passed, 1 failed, 1 skipped"), "{text}");
    }

    #[test]
    fn json_has_one_object_per_case() {
        let json = serde_json::to_value(sample()).unwrap();
        assert_eq!(json["cases"][0]["outcome"], "passed");
        assert_eq!(json["cases"][1]["outcome"], "skipped");
        assert_eq!(json["cases"][1]["message"], "needs an in-process target");
        assert_eq!(json["cases"][2]["name"], "cdi-specs");
        assert!(json["cases"][2]["durationMs"].is_number());
    }

    #[test]
    fn assert_passed_lists_the_failures() {
        let report = sample();
        assert!(!report.passed());
        let panic = std::panic::catch_unwind(|| report.assert_passed()).unwrap_err();
        let message = panic.downcast_ref::<String>().unwrap();
        assert!(message.contains("cdi-specs: spec a.json left"), "{message}");
        let mut ok = Report::new("d", "t");
        ok.push("a", "b", Outcome::Skipped("x".into()));
        ok.assert_passed();
    }
}
