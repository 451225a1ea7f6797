//! What a demo run reports: the printed text ([`Out`]), the claims that failed and where
//! ([`ClaimFailure`], [`Step`]), the claims that must fail ([`ExpectedFailure`]) and the counts
//! ([`DemoReport`]).

use std::collections::BTreeMap;

use super::target::AllocationMode;

/// The report being written, echoed on stdout as it goes when printing.
#[derive(Clone, Debug, Default)]
pub struct Out {
    text: String,
    print: bool,
}

impl Out {
    /// An empty report, printed as it is written when `print` is set.
    pub fn new(print: bool) -> Self {
        Self {
            text: String::new(),
            print,
        }
    }

    /// Appends `line` and a newline.
    pub fn line(&mut self, line: impl AsRef<str>) {
        let line = line.as_ref();
        self.text.push_str(line);
        self.text.push('\n');
        if self.print {
            use std::io::Write as _;
            // A closed stdout must not fail (or panic) the demo: the text is kept either way.
            let mut stdout = std::io::stdout().lock();
            let _ = writeln!(stdout, "{line}");
            let _ = stdout.flush();
        }
    }

    /// What was written so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// What was written, taken out.
    pub fn into_text(self) -> String {
        self.text
    }
}

/// The step a claim failed at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Allocation (and reservation for its Pods).
    Allocate,
    /// `NodePrepareResources` through the simulated kubelet.
    Prepare,
    /// `NodeUnprepareResources` through the simulated kubelet.
    Unprepare,
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Allocate => "allocate",
            Self::Prepare => "prepare",
            Self::Unprepare => "unprepare",
        })
    }
}

/// A claim that failed, at the first step it failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimFailure {
    /// The claim's name in the demo.
    pub claim: String,
    /// Where it failed.
    pub step: Step,
    /// Why.
    pub message: String,
}

/// How a claim the demo makes fail on purpose (a broken config, say) must fail: at this step,
/// with this error. That it fails so is part of the demo's success.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpectedFailure {
    /// The step it must fail at.
    pub step: Step,
    /// Text the failure's message must contain.
    pub error: String,
    /// Why it must fail, for the problem reported when it does not, e.g. `its config has a
    /// misspelled field`.
    pub because: String,
}

impl ExpectedFailure {
    /// Whether `failure` is this one.
    pub fn matches(&self, failure: &ClaimFailure) -> bool {
        failure.step == self.step && failure.message.contains(&self.error)
    }
}

/// The driver's own part of a [`DemoReport`]: what its extra checks saw, and the problems they
/// found.
pub trait ReportExtra: Clone + std::fmt::Debug + Default + Send + Sync + 'static {
    /// Problems beyond the common ones; none by default.
    fn problems(&self) -> Vec<String> {
        Vec::new()
    }
}

impl ReportExtra for () {}

/// What happened, counted from what the API server, the plugin and the kubelet answered.
#[derive(Clone, Debug)]
pub struct DemoReport<X = ()> {
    /// Claims the demo's Pods used.
    pub claims: usize,
    /// Claims allocated and reserved for all their Pods.
    pub allocated: usize,
    /// Claims prepared for all their Pods.
    pub prepared: usize,
    /// Claims unprepared without error.
    pub unprepared: usize,
    /// Claims that failed, each at its first failed step, in the demo's order.
    pub failed: Vec<ClaimFailure>,
    /// The claims that must fail, by name, and how.
    pub expected_failures: BTreeMap<String, ExpectedFailure>,
    /// CDI spec files left after unprepare.
    pub cdi_files_left: usize,
    /// Who allocated.
    pub allocation: AllocationMode,
    /// The driver's own part.
    pub extra: X,
    /// The report as printed.
    pub text: String,
}

impl<X: ReportExtra> DemoReport<X> {
    /// Whether `failure` is the one its claim must fail with.
    pub fn is_expected(&self, failure: &ClaimFailure) -> bool {
        self.expected_failures
            .get(&failure.claim)
            .is_some_and(|expected| expected.matches(failure))
    }

    /// Everything that did not go as it must: empty when the demo succeeded.
    pub fn problems(&self) -> Vec<String> {
        let mut problems: Vec<String> = self
            .failed
            .iter()
            .filter(|failure| !self.expected_failures.contains_key(&failure.claim))
            .map(|f| format!("claim {} failed to {}: {}", f.claim, f.step, f.message))
            .collect();
        for (claim, expected) in &self.expected_failures {
            match self.failed.iter().find(|f| &f.claim == claim) {
                None => problems.push(format!(
                    "claim {claim} did not fail, though {}",
                    expected.because
                )),
                Some(failure) if !expected.matches(failure) => problems.push(format!(
                    "claim {claim} failed to {} with an unexpected error (expected {} to fail \
                     with {:?}): {}",
                    failure.step, expected.step, expected.error, failure.message
                )),
                Some(_) => {}
            }
        }
        if self.cdi_files_left > 0 {
            problems.push(format!(
                "{} CDI spec file(s) left after unprepare",
                self.cdi_files_left
            ));
        }
        problems.extend(self.extra.problems());
        problems
    }

    /// The report, or a [`DemoFailed`] holding it when it has [`problems`](Self::problems).
    pub fn check(self) -> Result<Self, DemoFailed<X>> {
        let problems = self.problems();
        if problems.is_empty() {
            Ok(self)
        } else {
            Err(DemoFailed {
                report: Box::new(self),
                problems,
            })
        }
    }
}

/// A demo that ran to the end but did not go as it must; it holds the report.
#[derive(Debug, thiserror::Error)]
#[error("the demo failed: {}", problems.join("; "))]
pub struct DemoFailed<X: ReportExtra = ()> {
    /// What happened (boxed: a report is large, and errors travel by value).
    pub report: Box<DemoReport<X>>,
    /// What went wrong, as [`DemoReport::problems`] lists it.
    pub problems: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const BAD: &str = "bad-config";

    fn failure(claim: &str, step: Step, message: &str) -> ClaimFailure {
        ClaimFailure {
            claim: claim.into(),
            step,
            message: message.into(),
        }
    }

    fn report(failed: Vec<ClaimFailure>, cdi_files_left: usize) -> DemoReport {
        DemoReport {
            claims: 2,
            allocated: 2,
            prepared: 2 - failed.len().min(2),
            unprepared: 2,
            failed,
            expected_failures: BTreeMap::from([(
                BAD.to_owned(),
                ExpectedFailure {
                    step: Step::Prepare,
                    error: "unknown field".into(),
                    because: "its config is broken".into(),
                },
            )]),
            cdi_files_left,
            allocation: AllocationMode::Demo,
            extra: (),
            text: String::new(),
        }
    }

    #[test]
    fn only_the_expected_failure_is_success() {
        let expected = failure(BAD, Step::Prepare, "invalid: unknown field `x`");
        let ok = report(vec![expected.clone()], 0);
        assert!(ok.problems().is_empty());
        assert!(ok.is_expected(&expected));
        assert!(ok.check().is_ok());

        let problems = report(vec![], 0).problems();
        assert_eq!(
            problems,
            ["claim bad-config did not fail, though its config is broken"]
        );
        let other = failure(BAD, Step::Allocate, "unknown field");
        let problems = report(vec![other], 0).problems();
        assert_eq!(problems.len(), 1);
        assert!(
            problems[0].starts_with("claim bad-config failed to allocate with an unexpected"),
            "{problems:?}"
        );
        let unprepare = failure("gpu", Step::Unprepare, "boom");
        let failed = report(vec![unprepare, expected.clone()], 0)
            .check()
            .unwrap_err();
        assert_eq!(failed.problems, ["claim gpu failed to unprepare: boom"]);
        assert_eq!(
            failed.to_string(),
            "the demo failed: claim gpu failed to unprepare: boom"
        );
        let problems = report(vec![expected], 2).problems();
        assert_eq!(problems, ["2 CDI spec file(s) left after unprepare"]);
    }

    #[derive(Clone, Debug, Default)]
    struct Seen(bool);

    impl ReportExtra for Seen {
        fn problems(&self) -> Vec<String> {
            if self.0 {
                vec![]
            } else {
                vec!["not seen".into()]
            }
        }
    }

    #[test]
    fn the_extra_part_adds_its_problems() {
        let base = report(vec![failure(BAD, Step::Prepare, "unknown field")], 0);
        let with = |extra| DemoReport {
            claims: base.claims,
            allocated: base.allocated,
            prepared: base.prepared,
            unprepared: base.unprepared,
            failed: base.failed.clone(),
            expected_failures: base.expected_failures.clone(),
            cdi_files_left: 0,
            allocation: base.allocation,
            extra,
            text: String::new(),
        };
        assert!(with(Seen(true)).problems().is_empty());
        assert_eq!(with(Seen(false)).problems(), ["not seen"]);
    }

    #[test]
    fn out_keeps_the_lines() {
        let mut out = Out::new(false);
        out.line("one");
        out.line(String::from("\ntwo"));
        assert_eq!(out.text(), "one\n\ntwo\n");
        assert_eq!(out.into_text(), "one\n\ntwo\n");
    }
}
