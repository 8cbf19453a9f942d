//! What a stage needs from the host it runs on, stated from its options.
//!
//! Validation reads only the pipeline's own files, so a sink writing into
//! a directory that does not exist, a source reading a file nobody can
//! read, or a listener on a port already taken passes it and fails
//! milliseconds into the run.
//! `logbus validate --preflight` checks these statements on the host (the
//! systemd unit runs it before every start), each finding at the option
//! that names the path or address, with the fix. A plugin states; the
//! engine checks: no plugin does host I/O at validation time.

use std::path::PathBuf;

/// One thing the host must provide.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostNeed {
    /// A file read at start (must exist and be readable).
    ReadFile { path: PathBuf },
    /// Files followed by a glob: nothing matching is a warning (they may
    /// appear later), a parent directory that cannot be read is an error.
    ReadGlob { pattern: String },
    /// A directory files are written into: it must be writable, or
    /// missing and `create` (then its nearest existing parent must be).
    WriteDir { path: PathBuf, create: bool },
    /// An address listened on: it must be free to bind.
    Listen { address: String, udp: bool },
    /// A PEM file: readable, holding certificates (or a private key)
    /// that parse.
    Pem { path: PathBuf, key: bool },
    /// A certificate and its private key, which must belong together
    /// (stated besides the two `Pem` needs; checked when both parse).
    TlsIdentity { cert: PathBuf, key: PathBuf },
    /// An environment variable the stage reads its secret from.
    EnvVar { name: String },
    /// A program run by name or path: it must be found and executable.
    Program { name: String },
    /// File descriptors the stage may hold at once (files, connections),
    /// counted against the process's open-file limit.
    OpenFiles { count: u64 },
}

/// A need and the option that states it (`["tls", "cert_file"]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatedNeed {
    pub need: HostNeed,
    pub option: Vec<String>,
}

impl StatedNeed {
    pub fn new(need: HostNeed, option: &[&str]) -> Self {
        StatedNeed {
            need,
            option: option.iter().map(|s| s.to_string()).collect(),
        }
    }
}

impl StatedNeed {
    /// A listener's or a client's certificate and key under the option
    /// map `at` (`["tls"]`: `tls.cert_file`, `tls.key_file`): each file
    /// read, and the pair matched.
    pub fn tls_identity(cert: PathBuf, key: PathBuf, at: &[&str]) -> Vec<StatedNeed> {
        let option = |name: &str| {
            at.iter()
                .copied()
                .chain([name])
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        vec![
            StatedNeed {
                need: HostNeed::Pem {
                    path: cert.clone(),
                    key: false,
                },
                option: option("cert_file"),
            },
            StatedNeed {
                need: HostNeed::Pem {
                    path: key.clone(),
                    key: true,
                },
                option: option("key_file"),
            },
            StatedNeed {
                need: HostNeed::TlsIdentity { cert, key },
                option: option("key_file"),
            },
        ]
    }

    /// A client's `tls.ca_file`, if set (resolved against the pipeline's
    /// directory).
    pub fn client_ca(ca: Option<&std::path::Path>, cx: &crate::BuildContext) -> Option<StatedNeed> {
        ca.map(|ca| StatedNeed::tls_ca(cx.resolve(ca), &["tls"]))
    }

    /// The variable a secret is read from (`password_env`), if set.
    pub fn secret_env(name: Option<&str>, option: &str) -> Option<StatedNeed> {
        name.map(|name| StatedNeed {
            need: HostNeed::EnvVar {
                name: name.to_string(),
            },
            option: vec![option.to_string()],
        })
    }

    /// A CA bundle a client verifies its server with (`tls.ca_file`).
    pub fn tls_ca(path: PathBuf, at: &[&str]) -> StatedNeed {
        StatedNeed {
            need: HostNeed::Pem { path, key: false },
            option: at
                .iter()
                .copied()
                .chain(["ca_file"])
                .map(str::to_string)
                .collect(),
        }
    }
}

/// The directory part of a path template that holds no `{{field}}` and no
/// `%` directive: where every rendered path lies (`/logs/{{app}}/x.log` →
/// `/logs`).
pub fn fixed_dir(template: &str) -> PathBuf {
    let cut = [template.find("{{"), template.find('%')]
        .into_iter()
        .flatten()
        .min();
    let fixed = match cut {
        Some(at) => &template[..at],
        None => template,
    };
    let path = std::path::Path::new(fixed);
    let dir = match cut {
        // `/logs/{{app}}`: the template starts inside the last segment.
        Some(_) if fixed.ends_with('/') => path,
        _ => path.parent().unwrap_or(path),
    };
    if dir.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        dir.to_path_buf()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fixed_directory_of_a_template_is_where_every_path_lies() {
        assert_eq!(fixed_dir("/logs/{{app}}/x.log"), PathBuf::from("/logs"));
        assert_eq!(fixed_dir("/logs/app-{{app}}.log"), PathBuf::from("/logs"));
        assert_eq!(fixed_dir("/logs/%Y/x.log"), PathBuf::from("/logs"));
        assert_eq!(fixed_dir("/var/log/out.log"), PathBuf::from("/var/log"));
        assert_eq!(fixed_dir("out.log"), PathBuf::from("."));
        assert_eq!(fixed_dir("{{a}}.log"), PathBuf::from("."));
    }
}
