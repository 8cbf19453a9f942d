//! `logbus test --format junit`: the report CI systems read.

use quick_junit::{NonSuccessKind, Report, TestCase, TestCaseStatus, TestSuite};

use crate::Outcome;

/// One suite per pipeline file.
pub fn report(suites: &[(String, Vec<Outcome>)]) -> String {
    let mut report = Report::new("logbus");
    for (file, outcomes) in suites {
        let mut suite = TestSuite::new(file.as_str());
        for o in outcomes {
            let status = match &o.failure {
                None => TestCaseStatus::success(),
                Some(message) => {
                    let mut s = TestCaseStatus::non_success(NonSuccessKind::Failure);
                    s.set_message(message.lines().next().unwrap_or_default());
                    s.set_description(message.as_str());
                    s
                }
            };
            let mut case = TestCase::new(o.name.as_str(), status);
            case.set_time(o.duration);
            suite.add_test_case(case);
        }
        report.add_test_suite(suite);
    }
    report.to_string().expect("a JUnit report serialises")
}
