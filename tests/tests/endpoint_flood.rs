//! An EndpointSlice flood through `sluice controller` and the real kube client, from the
//! in-repo fake API server: 1,000 EndpointSlice updates per second spread over 100 Services, for
//! a minute (`SLUICE_FLOOD_SECS` to change it). The controller must keep up — every pool holds a
//! recent state throughout (the lag is sampled and printed) — and once the writes stop, the last
//! state of every slice must be in the data plane within 100 ms of the last write.
//!
//! Each slice's one endpoint encodes its generation in its address, so a pool's endpoint says
//! exactly which write it reflects.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use serde_json::Value;
use sluice_tests::fake_api::FakeApi;
use sluice_tests::*;

const SERVICES: u32 = 100;
const PER_SECOND: u32 = 1_000;

/// Service `i`'s endpoint at generation `generation`.
fn addr(i: u32, generation: u32) -> Ipv4Addr {
    Ipv4Addr::from(0x0a00_0000 + (i << 16) + (generation % 65_000))
}

fn slice(i: u32, generation: u32) -> Value {
    numbered_slice(i, &[addr(i, generation)])
}

/// The generation each pool's endpoint shows, by Service index (`None`: no endpoint).
fn shown(dp: &sluice_proxy::state::dataplane::DataPlane) -> Vec<Option<u32>> {
    let mut by = vec![None; SERVICES as usize];
    for c in dp.clusters() {
        let Some(i) = c
            .key
            .service
            .strip_prefix("svc-")
            .and_then(|s| s.parse::<usize>().ok())
        else {
            continue;
        };
        let set = c.endpoints.load();
        let gen_of = |m: &sluice_proxy::upstream::endpoint::Member| match m.endpoint.addr.ip() {
            std::net::IpAddr::V4(v4) => Some(u32::from(v4) & 0xffff),
            std::net::IpAddr::V6(_) => None,
        };
        if let (Some(slot), Some(m)) = (by.get_mut(i), set.members.first()) {
            *slot = gen_of(m);
        }
    }
    by
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_endpoint_updates_a_second_are_followed_and_the_last_lands_within_100_ms() {
    let secs: u32 = std::env::var("SLUICE_FLOOD_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let fake = FakeApi::start().await;
    many_services(&fake, SERVICES, "flood.test", |i| slice(i, 0));
    let c = controller(&fake, "solo", &[]).await;
    let dp = std::sync::Arc::clone(&c.running.dp);
    assert!(
        eventually(Duration::from_secs(20), || async {
            shown(&dp).iter().all(|g| *g == Some(0))
        })
        .await,
        "every pool ready"
    );

    let total = secs * PER_SECOND;
    let started = tokio::time::Instant::now();
    let mut worst_lag = 0u32;
    let mut lags = Vec::new();
    for t in 0..total {
        let (i, generation) = (t % SERVICES, t / SERVICES + 1);
        fake.apply(slice(i, generation));
        if t % 10 == 9 {
            // Paced: write n is due at n / PER_SECOND s.
            let due = started
                + Duration::from_micros(u64::from(t + 1) * 1_000_000 / u64::from(PER_SECOND));
            tokio::time::sleep_until(due).await;
        }
        if t % 500 == 499 {
            // How many generations behind the slowest pool is (one generation: 100 ms).
            let written = t / SERVICES + 1;
            let lag = shown(&dp)
                .iter()
                .map(|g| written.saturating_sub(g.unwrap_or(0)))
                .max()
                .unwrap_or(0);
            worst_lag = worst_lag.max(lag);
            lags.push(lag);
        }
    }
    let last_write = Instant::now();
    let wrote_for = started.elapsed();
    let final_gen = |i: u32| (total - 1 - i) / SERVICES + 1;
    let want: Vec<Option<u32>> = (0..SERVICES).map(|i| Some(final_gen(i) % 65_000)).collect();
    let landed = loop {
        if shown(&dp) == want {
            break last_write.elapsed();
        }
        assert!(
            last_write.elapsed() < Duration::from_secs(10),
            "the last state never landed"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    lags.sort_unstable();
    let median = lags.get(lags.len() / 2).copied().unwrap_or(0);
    println!(
        "{total} EndpointSlice updates in {wrote_for:?} ({:.0}/s) over {SERVICES} Services: the \
         slowest pool was a median {median} and at worst {worst_lag} generations behind (one \
         generation = {} ms); the last state of every slice landed {landed:?} after the last write",
        f64::from(total) / wrote_for.as_secs_f64(),
        1000 * SERVICES / PER_SECOND,
    );
    assert!(
        wrote_for < Duration::from_secs(u64::from(secs)) + Duration::from_secs(2),
        "the writer itself fell behind: {wrote_for:?}"
    );
    assert!(
        landed < Duration::from_millis(100),
        "landed {landed:?} after the last write"
    );
    assert!(
        worst_lag <= 10,
        "fell behind by {worst_lag} generations (1 s)"
    );
    c.shutdown(Duration::from_secs(3)).await;
}
