//! A long scenario told in named steps: each step says when it starts and how long it took, and a failure
//! names the step it happened in (the panic's message says what failed; this says where in the story), so
//! that the first failure of a test of many parts no longer leaves its reader guessing which part broke.
//! The steps share the scenario's state (its browser, its jobs), so they stay in one test, in order.

use std::time::Instant;

#[derive(Debug)]
pub struct Steps {
    scenario: &'static str,
    current: Option<(&'static str, Instant)>,
}

impl Steps {
    pub fn new(scenario: &'static str) -> Steps {
        Steps { scenario, current: None }
    }

    /// Ends the current step and starts `name`.
    pub fn enter(&mut self, name: &'static str) {
        self.finish();
        eprintln!("[{}] step: {name}", self.scenario);
        self.current = Some((name, Instant::now()));
    }

    fn finish(&mut self) {
        if let Some((name, started)) = self.current.take() {
            eprintln!("[{}] done in {:.1} s: {name}", self.scenario, started.elapsed().as_secs_f64());
        }
    }
}

impl Drop for Steps {
    fn drop(&mut self) {
        match self.current.take() {
            Some((name, started)) if std::thread::panicking() => eprintln!(
                "[{}] FAILED in step \"{name}\", {:.1} s into it (the panic above says what)",
                self.scenario,
                started.elapsed().as_secs_f64()
            ),
            current => {
                self.current = current;
                self.finish();
            }
        }
    }
}
