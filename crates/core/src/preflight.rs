//! `logbus validate --preflight`: what the host must provide, checked on
//! the host before anything starts.
//!
//! Plugins state their needs ([`HostNeed`]); validation places each at the
//! option that names it; this module does the I/O, and only when asked, so
//! plain validation stays free of side effects and portable between the
//! CI runner and the host. Nothing here creates, writes or keeps anything:
//! writability is asked with `access(2)`, a port with a bind released at
//! once.

use std::path::{Path, PathBuf};

use logbus_plugin_api::HostNeed;

use crate::config::Pipeline;
use crate::diagnostic::Diagnostic;
use crate::yaml::Pos;

/// A need, where it is stated.
#[derive(Debug, Clone)]
pub struct PlacedNeed {
    pub stage: String,
    pub pos: Pos,
    /// The option, dotted (`tls.cert_file`).
    pub option: String,
    pub need: HostNeed,
}

/// Every finding of the host checks.
pub fn check(needs: &[PlacedNeed], pipeline: Option<&Pipeline>) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    let mut open_files = 0u64;
    for n in needs {
        let found = match &n.need {
            HostNeed::ReadFile { path } => readable_file(path),
            HostNeed::ReadGlob { pattern } => glob_matches(pattern),
            HostNeed::WriteDir { path, create } => writable_dir(path, *create),
            HostNeed::Listen { address, udp } => free_address(address, *udp),
            HostNeed::Pem { path, key } => pem(path, *key),
            HostNeed::TlsIdentity { cert, key } => tls_identity(cert, key),
            HostNeed::EnvVar { name } => env_var(name),
            HostNeed::Program { name } => program(name),
            HostNeed::OpenFiles { count } => {
                open_files += count;
                None
            }
        };
        if let Some(d) = found {
            out.push(
                Diagnostic {
                    message: format!("option `{}`: {}", n.option, d.message),
                    ..d
                }
                .stage(&n.stage)
                .at(n.pos),
            );
        }
    }
    if let Some(p) = pipeline {
        for s in &p.stages {
            if let Some(d) = s.durable(&p.settings, &p.base_dir) {
                if let Some(found) = writable_dir(&d.config.dir, true) {
                    out.push(
                        Diagnostic {
                            message: format!("the disk queue: {}", found.message),
                            ..found
                        }
                        .stage(&s.id)
                        .at(s.pos),
                    );
                }
                open_files += 4;
            }
        }
        if let Some(api) = &p.settings.api
            && let Some(d) = free_address(&api.listen, false)
        {
            out.push(Diagnostic {
                message: format!("settings.api.listen: {}", d.message),
                ..d
            });
        }
    }
    if let Some(limit) = open_file_limit() {
        // The runtime, the API and the binary's own files take some.
        let wanted = open_files + 64;
        if wanted > limit {
            out.push(Diagnostic::warning(
                "host-open-files",
                format!(
                    "the stages may hold {open_files} files and connections at once, and this process may open {limit} (ulimit -n): raise it (systemd: LimitNOFILE={wanted}) or lower max_connections / max_open_files"
                ),
            ));
        }
    }
    out
}

fn readable_file(path: &Path) -> Option<Diagnostic> {
    match std::fs::File::open(path) {
        Ok(f) if f.metadata().is_ok_and(|m| m.is_dir()) => Some(Diagnostic::error(
            "host-file",
            format!("{} is a directory, not a file", path.display()),
        )),
        Ok(_) => None,
        Err(e) => Some(Diagnostic::error(
            "host-file",
            format!("cannot read {}: {}", path.display(), io_words(&e)),
        )),
    }
}

fn glob_matches(pattern: &str) -> Option<Diagnostic> {
    let paths = match glob::glob(pattern) {
        Ok(p) => p,
        Err(e) => {
            return Some(Diagnostic::error(
                "host-glob",
                format!("`{pattern}` is not a glob: {e}"),
            ));
        }
    };
    let mut any = false;
    for entry in paths {
        match entry {
            Ok(_) => any = true,
            Err(e) => {
                return Some(Diagnostic::error(
                    "host-glob",
                    format!(
                        "cannot read {} while matching `{pattern}`: {}",
                        e.path().display(),
                        io_words(e.error())
                    ),
                ));
            }
        }
    }
    (!any).then(|| {
        Diagnostic::warning(
            "host-glob",
            format!("nothing matches `{pattern}` yet (files that appear later are followed)"),
        )
    })
}

fn writable_dir(path: &Path, create: bool) -> Option<Diagnostic> {
    match std::fs::metadata(path) {
        Ok(m) if !m.is_dir() => Some(Diagnostic::error(
            "host-dir",
            format!("{} exists and is not a directory", path.display()),
        )),
        Ok(_) => (!can_write(path)).then(|| {
            Diagnostic::error(
                "host-dir",
                format!(
                    "{} is not writable by this user (uid {})",
                    path.display(),
                    uid()
                ),
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if !create {
                return Some(Diagnostic::error(
                    "host-dir",
                    format!(
                        "{} does not exist: create it, or set `create_dirs: true`",
                        path.display()
                    ),
                ));
            }
            let parent = nearest_existing(path);
            (!can_write(&parent)).then(|| {
                Diagnostic::error(
                    "host-dir",
                    format!(
                        "{} does not exist and cannot be made: {} is not writable by this user (uid {})",
                        path.display(),
                        parent.display(),
                        uid()
                    ),
                )
            })
        }
        Err(e) => Some(Diagnostic::error(
            "host-dir",
            format!("cannot look at {}: {}", path.display(), io_words(&e)),
        )),
    }
}

fn nearest_existing(path: &Path) -> PathBuf {
    let mut p = path.to_path_buf();
    while !p.exists() {
        match p.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => p = parent.to_path_buf(),
            _ => return PathBuf::from("."),
        }
    }
    p
}

fn can_write(dir: &Path) -> bool {
    use rustix::fs::Access;
    rustix::fs::access(dir, Access::WRITE_OK | Access::EXEC_OK).is_ok()
}

fn uid() -> u32 {
    rustix::process::getuid().as_raw()
}

fn free_address(address: &str, udp: bool) -> Option<Diagnostic> {
    let result = if udp {
        std::net::UdpSocket::bind(address).map(drop)
    } else {
        std::net::TcpListener::bind(address).map(drop)
    };
    result.err().map(|e| {
        let hint = match e.kind() {
            std::io::ErrorKind::AddrInUse => {
                "; another process listens there (`ss -ltnp` names it)"
            }
            std::io::ErrorKind::PermissionDenied => {
                "; ports below 1024 need CAP_NET_BIND_SERVICE (systemd: AmbientCapabilities=CAP_NET_BIND_SERVICE)"
            }
            _ => "",
        };
        Diagnostic::error(
            "host-listen",
            format!("cannot listen on {address}: {}{hint}", io_words(&e)),
        )
    })
}

/// A PEM file as the stage's own loader reads it (crate `logbus-tls`).
fn pem(path: &Path, key: bool) -> Option<Diagnostic> {
    let checked = match key {
        true => logbus_tls::check_private_key(path),
        false => logbus_tls::check_certificates(path),
    };
    let what = if key {
        "a PEM private key"
    } else {
        "PEM certificates"
    };
    checked
        .err()
        .map(|e| Diagnostic::error("host-tls", format!("{e} (expected {what})")))
}

/// A certificate and key that belong together; reported only when both
/// files are fine on their own (their own needs say what is wrong else).
fn tls_identity(cert: &Path, key: &Path) -> Option<Diagnostic> {
    if pem(cert, false).is_some() || pem(key, true).is_some() {
        return None;
    }
    logbus_tls::check_identity(cert, key)
        .err()
        .map(|e| Diagnostic::error("host-tls", e.to_string()))
}

fn env_var(name: &str) -> Option<Diagnostic> {
    match std::env::var(name) {
        Ok(_) => None,
        Err(std::env::VarError::NotPresent) => Some(Diagnostic::error(
            "host-env",
            format!(
                "the environment variable `{name}` is not set (the stage reads its secret from it)"
            ),
        )),
        Err(std::env::VarError::NotUnicode(_)) => Some(Diagnostic::error(
            "host-env",
            format!("the environment variable `{name}` is not UTF-8"),
        )),
    }
}

fn program(name: &str) -> Option<Diagnostic> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if name.contains('/') {
        return (!executable(Path::new(name))).then(|| {
            Diagnostic::error("host-program", format!("{name} is not an executable file"))
        });
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path).any(|dir| executable(&dir.join(name)));
    (!found).then(|| {
        Diagnostic::error(
            "host-program",
            format!("`{name}` is not found in PATH ({})", path.to_string_lossy()),
        )
    })
}

/// The soft limit on open files, when there is one.
fn open_file_limit() -> Option<u64> {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current
}

/// An I/O error without the `(os error N)` suffix.
fn io_words(e: &std::io::Error) -> String {
    let text = e.to_string();
    match text.find(" (os error") {
        Some(at) => text[..at].to_lowercase(),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placed(need: HostNeed) -> PlacedNeed {
        PlacedNeed {
            stage: "s".into(),
            pos: Pos { line: 3, col: 5 },
            option: "path".into(),
            need,
        }
    }

    fn codes(needs: Vec<HostNeed>) -> Vec<(&'static str, String)> {
        let placed: Vec<PlacedNeed> = needs.into_iter().map(placed).collect();
        check(&placed, None)
            .into_iter()
            .filter(|d| d.code != "host-open-files")
            .map(|d| (d.code, d.message))
            .collect()
    }

    #[test]
    fn files_directories_globs_and_programs_are_checked_on_the_host() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f.log");
        std::fs::write(&file, "x").unwrap();
        let missing = dir.path().join("nope/deeper");
        assert!(
            codes(vec![
                HostNeed::ReadFile { path: file.clone() },
                HostNeed::WriteDir {
                    path: dir.path().into(),
                    create: false
                },
                HostNeed::WriteDir {
                    path: missing.clone(),
                    create: true
                },
                HostNeed::ReadGlob {
                    pattern: format!("{}/*.log", dir.path().display())
                },
                HostNeed::Program { name: "sh".into() },
            ])
            .is_empty()
        );
        let found = codes(vec![
            HostNeed::ReadFile {
                path: dir.path().join("absent"),
            },
            HostNeed::ReadFile {
                path: dir.path().into(),
            },
            HostNeed::WriteDir {
                path: missing,
                create: false,
            },
            HostNeed::WriteDir {
                path: file.clone(),
                create: true,
            },
            HostNeed::ReadGlob {
                pattern: format!("{}/*.gz", dir.path().display()),
            },
            HostNeed::Program {
                name: "no-such-program-here".into(),
            },
            HostNeed::Program {
                name: file.display().to_string(),
            },
        ]);
        let got: Vec<&str> = found.iter().map(|(c, _)| *c).collect();
        assert_eq!(
            got,
            [
                "host-file",
                "host-file",
                "host-dir",
                "host-dir",
                "host-glob",
                "host-program",
                "host-program"
            ]
        );
        assert!(
            found[0].1.starts_with("option `path`: cannot read "),
            "{}",
            found[0].1
        );
        assert!(
            found[0].1.ends_with(": no such file or directory"),
            "{}",
            found[0].1
        );
        assert!(
            found[2].1.contains("set `create_dirs: true`"),
            "{}",
            found[2].1
        );
        assert!(found[3].1.contains("is not a directory"), "{}", found[3].1);
    }

    #[test]
    fn a_taken_port_and_a_file_without_pem_are_errors() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = taken.local_addr().unwrap().to_string();
        let found = codes(vec![
            HostNeed::Listen {
                address: address.clone(),
                udp: false,
            },
            HostNeed::Listen {
                address: "127.0.0.1:0".into(),
                udp: true,
            },
        ]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, "host-listen");
        assert!(
            found[0].1.contains("another process listens there"),
            "{}",
            found[0].1
        );

        let dir = tempfile::tempdir().unwrap();
        let pair = |name: &str| {
            let made = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
            let cert = dir.path().join(format!("{name}.crt"));
            let key = dir.path().join(format!("{name}.key"));
            std::fs::write(&cert, made.cert.pem()).unwrap();
            std::fs::write(&key, made.key_pair.serialize_pem()).unwrap();
            (cert, key)
        };
        let (cert, key) = pair("one");
        let (_, other_key) = pair("two");
        let broken = dir.path().join("broken.pem");
        std::fs::write(
            &broken,
            "-----BEGIN CERTIFICATE-----\nMII!\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let identity = |cert: &PathBuf, key: &PathBuf| HostNeed::TlsIdentity {
            cert: cert.clone(),
            key: key.clone(),
        };
        // The right pair, each file on its own: nothing to say.
        assert!(
            codes(vec![
                HostNeed::Pem {
                    path: cert.clone(),
                    key: false
                },
                HostNeed::Pem {
                    path: key.clone(),
                    key: true
                },
                identity(&cert, &key),
            ])
            .is_empty()
        );
        let found = codes(vec![
            // A certificate where a key belongs, a key that is not there.
            HostNeed::Pem {
                path: cert.clone(),
                key: true,
            },
            HostNeed::Pem {
                path: dir.path().join("k.pem"),
                key: true,
            },
            // Base64 that does not decode.
            HostNeed::Pem {
                path: broken.clone(),
                key: false,
            },
            // Two good files that do not belong together.
            identity(&cert, &other_key),
            // A broken file: its own need reports it, not the pair.
            identity(&broken, &key),
        ]);
        let got: Vec<&str> = found.iter().map(|(c, _)| *c).collect();
        assert_eq!(got, ["host-tls"; 4], "{found:?}");
        assert!(found[0].1.contains("one.crt"), "{}", found[0].1);
        assert!(
            found[0].1.ends_with("(expected a PEM private key)"),
            "{}",
            found[0].1
        );
        assert!(found[1].1.contains("k.pem"), "{}", found[1].1);
        assert!(found[2].1.contains("broken.pem"), "{}", found[2].1);
        assert!(
            found[3].1.contains("does not belong to the certificate"),
            "{}",
            found[3].1
        );
    }

    #[test]
    fn an_unset_secret_variable_is_an_error() {
        let found = codes(vec![
            HostNeed::EnvVar {
                name: "PATH".into(),
            },
            HostNeed::EnvVar {
                name: "LOGBUS_NO_SUCH_VARIABLE_SET".into(),
            },
        ]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, "host-env");
        assert!(
            found[0]
                .1
                .contains("`LOGBUS_NO_SUCH_VARIABLE_SET` is not set"),
            "{}",
            found[0].1
        );
    }

    #[test]
    fn more_open_files_than_the_limit_is_a_warning() {
        let Some(limit) = open_file_limit() else {
            return;
        };
        let placed = vec![placed(HostNeed::OpenFiles { count: limit })];
        let found = check(&placed, None);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].code, "host-open-files");
        assert!(
            found[0].message.contains("LimitNOFILE="),
            "{}",
            found[0].message
        );
        assert!(check(&[], None).is_empty());
    }
}
