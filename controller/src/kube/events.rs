//! Warning Events for configuration problems, rate-limited per object: one Ingress with 5,000
//! invalid paths must not become 5,000 Events (the API server stores each, and `kubectl describe`
//! drowns). Per object, a burst of [`BURST`] Events, then one more per [`REFILL`] (a token
//! bucket, like client-go's event spam filter); problems beyond that are summed up in one
//! `ProblemsNotReported` Event per object and batch. The log gets the same selection; every
//! problem is listed in `/api/v1/status` and counted in `sluice_config_problems`.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use sluice_config::{ObjectRef, Problem, Severity};
use tokio::time::Instant;

/// Events an object may get at once.
pub const BURST: u32 = 10;
/// Time to earn one more.
pub const REFILL: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: u32,
    since: Instant,
}

/// The per-object budgets.
#[derive(Debug, Default)]
pub struct EventBudget {
    buckets: HashMap<ObjectRef, Bucket>,
}

impl EventBudget {
    /// Whether `object` may get another Event at `now` (and spends it if so).
    pub fn allow(&mut self, object: &ObjectRef, now: Instant) -> bool {
        let b = self.buckets.entry(object.clone()).or_insert(Bucket {
            tokens: BURST,
            since: now,
        });
        let earned = now.saturating_duration_since(b.since).as_secs() / REFILL.as_secs().max(1);
        if earned > 0 {
            b.tokens = b
                .tokens
                .saturating_add(u32::try_from(earned).unwrap_or(u32::MAX))
                .min(BURST);
            b.since = now;
        }
        if b.tokens == 0 {
            return false;
        }
        b.tokens -= 1;
        true
    }

    /// Forgets objects whose bucket is full again (so the map does not grow with every object
    /// that ever had a problem).
    pub fn forget_idle(&mut self, now: Instant) {
        let full = REFILL * BURST;
        self.buckets
            .retain(|_, b| now.saturating_duration_since(b.since) < full);
    }
}

/// Of `problems` (new ones, in order), those to send as Events at `now`, followed by one summary
/// per object whose problems did not all fit its budget.
pub fn to_send(budget: &mut EventBudget, problems: &[&Problem], now: Instant) -> Vec<Problem> {
    let mut out = Vec::new();
    let mut held: BTreeMap<&ObjectRef, usize> = BTreeMap::new();
    for p in problems {
        if budget.allow(&p.object, now) {
            out.push((*p).clone());
        } else {
            *held.entry(&p.object).or_default() += 1;
        }
    }
    for (object, n) in held {
        out.push(Problem {
            object: object.clone(),
            field: String::new(),
            message: format!(
                "{n} more problem(s) not sent as Events (at most {BURST} at once, then one per {}s per object); /api/v1/status lists them all",
                REFILL.as_secs()
            ),
            severity: Severity::Warning,
            reason: "ProblemsNotReported",
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(object: &ObjectRef, i: usize) -> Problem {
        Problem {
            object: object.clone(),
            field: format!("spec.rules[0].http.paths[{i}]"),
            message: "invalid".into(),
            severity: Severity::Error,
            reason: "InvalidPath",
        }
    }

    #[test]
    fn a_burst_then_one_per_refill_and_a_summary_for_the_rest() {
        let (a, b) = (
            ObjectRef::new("Ingress", "ns", "a"),
            ObjectRef::new("Ingress", "ns", "b"),
        );
        let many: Vec<Problem> = (0..5000).map(|i| problem(&a, i)).collect();
        let few: Vec<Problem> = (0..3).map(|i| problem(&b, i)).collect();
        let all: Vec<&Problem> = many.iter().chain(&few).collect();
        let mut budget = EventBudget::default();
        let t0 = Instant::now();
        let sent = to_send(&mut budget, &all, t0);
        let of = |o: &ObjectRef, reason: &str| {
            sent.iter()
                .filter(|p| &p.object == o && p.reason == reason)
                .count()
        };
        assert_eq!(of(&a, "InvalidPath"), BURST as usize);
        assert_eq!(of(&a, "ProblemsNotReported"), 1);
        assert!(sent.iter().any(|p| p.message.starts_with("4990 more")));
        assert_eq!(
            of(&b, "InvalidPath"),
            3,
            "another object has its own budget"
        );
        assert_eq!(of(&b, "ProblemsNotReported"), 0);

        let later: Vec<&Problem> = many.iter().take(3).collect();
        let sent = to_send(&mut budget, &later, t0 + REFILL / 2);
        assert_eq!(sent.len(), 1, "nothing earned yet: only the summary");
        let sent = to_send(&mut budget, &later, t0 + REFILL * 2);
        assert_eq!(sent.len(), 3, "two earned, then a summary: {sent:?}");
        assert_eq!(sent[2].reason, "ProblemsNotReported");

        budget.forget_idle(t0 + REFILL * 2 + REFILL * BURST);
        assert!(budget.buckets.is_empty());
    }
}
