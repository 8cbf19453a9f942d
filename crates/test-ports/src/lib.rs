//! Ports for tests that hand a listening address to the code under test.
//!
//! The obvious way — bind port 0, read the port, drop the listener, pass the
//! number on — draws from the kernel's ephemeral range, which outgoing
//! connections draw from too. Between the drop and the engine's bind, any
//! client in the run (another test's connection, or this test's own probe
//! waiting for the listener) may take that very port; a probe `connect` to a
//! port in that range can even connect to itself (TCP simultaneous open).
//! The engine then fails with "Address already in use" — a flaky failure CI
//! hit. Ports from here lie below the ephemeral range, so only another
//! listener can take one, never a client.

use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// First port handed out; Linux's ephemeral range starts at 32768.
const FIRST: u32 = 20_000;
/// How many ports the tests cycle through, ending below 32768.
const SPAN: u32 = 12_000;

/// A free loopback port below the kernel's ephemeral range. Ports are
/// handed out once each per process (until all 12,000 are used), from a
/// start that differs between processes; another process can still bind
/// one first, a race these tests accept as it needs a second listener.
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let _ = NEXT.compare_exchange(
        u32::MAX,
        first_offset(std::process::id()),
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    loop {
        let port = (FIRST + NEXT.fetch_add(1, Ordering::Relaxed) % SPAN) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// Where in the span process `pid` starts: spread over the whole span, so
/// that test processes running side by side rarely try the same ports.
fn first_offset(pid: u32) -> u32 {
    pid.wrapping_mul(7919) % SPAN
}

/// Waits until something listens on loopback `port`; panics after 30 s.
pub fn wait_for_port(port: u16) {
    let began = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            began.elapsed() < Duration::from_secs(30),
            "nothing ever listened on port {port}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_lie_below_the_ephemeral_range_and_are_not_repeated() {
        let ports: Vec<u16> = (0..50).map(|_| free_port()).collect();
        assert!(ports.iter().all(|&p| (20_000..32_000).contains(&p)));
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ports.len());
        // Each one is free: it can be bound now.
        for p in ports {
            TcpListener::bind(("127.0.0.1", p)).unwrap();
        }
    }

    #[test]
    fn a_taken_port_is_skipped() {
        let held = TcpListener::bind(("127.0.0.1", free_port())).unwrap();
        let taken = held.local_addr().unwrap().port();
        // Cycle through the whole span: the held port never comes back.
        for _ in 0..SPAN {
            assert_ne!(free_port(), taken);
        }
    }

    #[test]
    fn processes_start_at_different_places_within_the_span() {
        let starts: Vec<u32> = [1, 2, 4242, 65_537, u32::MAX].map(first_offset).into();
        assert!(starts.iter().all(|&s| s < SPAN), "{starts:?}");
        assert_eq!(first_offset(1), 7919);
        assert_eq!(first_offset(2), 2 * 7919 - SPAN);
    }

    #[test]
    fn waiting_returns_once_a_listener_is_there() {
        let port = free_port();
        let listening = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let server = {
            let listening = listening.clone();
            std::thread::spawn(move || {
                // Late on purpose: the wait must outlast it (a wait that
                // returned at once would find nothing listening yet).
                std::thread::sleep(Duration::from_millis(100));
                listening.store(true, Ordering::SeqCst);
                let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
                listener.accept().unwrap(); // the probe's connection
            })
        };
        wait_for_port(port);
        // Something listened, so the flag (set before the bind) is set.
        assert!(listening.load(Ordering::SeqCst));
        server.join().unwrap();
    }
}
