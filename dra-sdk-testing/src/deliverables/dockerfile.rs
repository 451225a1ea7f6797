//! Checks of a plugin image's Dockerfile without a container engine (none runs in this
//! project's CI), shared by the drivers of this repository: the build stage's `cargo build`
//! names a profile, package and binary that exist, and the final stage copies the binary from
//! where that command puts it.

use std::path::{Path, PathBuf};

/// The repository root, from a crate two levels below it.
pub fn workspace(manifest_dir: &str) -> PathBuf {
    Path::new(manifest_dir).join("../..")
}

/// The words after `cargo build` in a Dockerfile, up to the next `&&`.
pub fn cargo_build_args(dockerfile: &str) -> Vec<String> {
    let text = dockerfile.replace("\\\n", " ");
    let line = text
        .lines()
        .find(|line| line.contains("cargo build"))
        .expect("a cargo build step");
    let after = &line[line.find("cargo build").unwrap() + "cargo build".len()..];
    after
        .split("&&")
        .next()
        .unwrap()
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// The value after `name` in `args`.
pub fn flag(args: &[String], name: &str) -> String {
    let at = args
        .iter()
        .position(|a| a == name)
        .unwrap_or_else(|| panic!("{name} missing"));
    args[at + 1].clone()
}

/// The Dockerfile at `path` builds `binary` of `package` with `--locked`, under a profile of
/// the workspace's manifest, and the final stage copies it from `target/<profile>/` to
/// `/usr/bin/` and runs it. Returns the build command's arguments for further checks.
pub fn check_build_stage(workspace: &Path, path: &str, package: &str, binary: &str) -> Vec<String> {
    let text = std::fs::read_to_string(workspace.join(path)).unwrap();
    let args = cargo_build_args(&text);
    assert!(args.contains(&"--locked".to_owned()), "{args:?}");
    assert_eq!(flag(&args, "-p"), package);
    assert_eq!(flag(&args, "--bin"), binary);
    let profile = flag(&args, "--profile");
    let manifest = std::fs::read_to_string(workspace.join("Cargo.toml")).unwrap();
    assert!(
        manifest.contains(&format!("[profile.{profile}]")),
        "no profile {profile}"
    );
    // Cargo puts a custom profile's output in target/<profile>/.
    let built = format!("target/{profile}/{binary}");
    assert!(text.contains(&built), "{path} does not take {built}");
    assert!(text.contains(&format!("/usr/bin/{binary}")));
    assert!(text.contains(&format!("ENTRYPOINT [\"/usr/bin/{binary}\"]")));
    args
}

/// The build image is `rust:<the pinned toolchain>-…` (the exact version: `rust:1.95` would
/// float to the newest 1.95.x), and it adds the toolchain file's components.
pub fn check_toolchain(workspace: &Path, path: &str) {
    let pinned = std::fs::read_to_string(workspace.join("rust-toolchain.toml")).unwrap();
    let field = |name: &str| {
        pinned
            .lines()
            .find_map(|line| line.trim().strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in rust-toolchain.toml"))
            .to_owned()
    };
    let channel = field("channel")
        .split('"')
        .nth(1)
        .expect("a channel in rust-toolchain.toml")
        .to_owned();
    assert_eq!(
        channel.split('.').count(),
        3,
        "{channel}: not an exact version"
    );
    let from = format!("FROM docker.io/library/rust:{channel}-");
    let text = std::fs::read_to_string(workspace.join(path)).unwrap();
    assert!(
        text.contains(&from),
        "{path}: the build image is not {from}*"
    );
    let components: Vec<String> = field("components")
        .split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    let add = text
        .lines()
        .find(|line| line.contains("rustup component add"))
        .unwrap_or_else(|| panic!("{path}: no rustup component add"));
    for component in &components {
        assert!(
            add.split_whitespace().any(|word| word == component),
            "{path}: {add} lacks {component}"
        );
    }
}

/// `.dockerignore` keeps `target/` and `.git/` out of every image's build context.
pub fn check_build_context(workspace: &Path) {
    let ignore = std::fs::read_to_string(workspace.join(".dockerignore")).unwrap();
    for pattern in ["target/", ".git/"] {
        assert!(
            ignore.lines().any(|line| line.trim() == pattern),
            "{pattern}"
        );
    }
}

/// A `FROM` line: the image and the stage name it is given (`AS <name>`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stage {
    /// The image reference (`nvcr.io/nvidia/k8s/container-toolkit:v1.18.1`).
    pub image: String,
    /// The stage name, when the line names one.
    pub name: Option<String>,
}

/// The `FROM` lines of a Dockerfile, in order (flags such as `--platform` skipped).
pub fn stages(dockerfile: &str) -> Vec<Stage> {
    dockerfile
        .replace("\\\n", " ")
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            if !words.next()?.eq_ignore_ascii_case("FROM") {
                return None;
            }
            let mut words = words.skip_while(|word| word.starts_with("--"));
            let image = words.next()?.to_owned();
            let name = match (words.next(), words.next()) {
                (Some(as_), Some(name)) if as_.eq_ignore_ascii_case("AS") => Some(name.to_owned()),
                _ => None,
            };
            Some(Stage { image, name })
        })
        .collect()
}

/// A `COPY --from=<stage or image>` line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopyFrom {
    /// The stage name or image after `--from=`.
    pub from: String,
    /// The paths copied.
    pub sources: Vec<String>,
    /// Where they go in the image.
    pub destination: String,
}

/// The `COPY --from=...` lines of a Dockerfile, in order (other flags skipped; the JSON
/// form `COPY ["a", "b"]` is not parsed).
pub fn copies_from(dockerfile: &str) -> Vec<CopyFrom> {
    dockerfile
        .replace("\\\n", " ")
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            if !words.next()?.eq_ignore_ascii_case("COPY") {
                return None;
            }
            let mut from = None;
            let mut paths = Vec::new();
            for word in words {
                if let Some(value) = word.strip_prefix("--from=") {
                    from = Some(value.to_owned());
                } else if !word.starts_with("--") {
                    paths.push(word.to_owned());
                }
            }
            let destination = paths.pop()?;
            Some(CopyFrom {
                from: from?,
                sources: paths,
                destination,
            })
        })
        .collect()
}

/// The image a `COPY --from=<from>` reads: the image of the stage named `from`, else `from`
/// itself (an image reference).
pub fn image_of(dockerfile: &str, from: &str) -> String {
    stages(dockerfile)
        .into_iter()
        .find(|stage| stage.name.as_deref() == Some(from))
        .map(|stage| stage.image)
        .unwrap_or_else(|| from.to_owned())
}

/// Whether an image reference is pinned: a digest, or a tag naming an exact version
/// (`v1.18.1`, `1.95.0-bookworm`), never `latest` or a bare `1.18`.
pub fn is_pinned(image: &str) -> bool {
    if image.contains("@sha256:") {
        return true;
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    let Some((_, tag)) = last.split_once(':') else {
        return false;
    };
    let version = tag.trim_start_matches('v');
    let numbers: Vec<&str> = version
        .split(['-', '+'])
        .next()
        .unwrap_or("")
        .split('.')
        .collect();
    numbers.len() >= 3
        && numbers
            .iter()
            .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "FROM --platform=$BUILDPLATFORM rust:1.95.0-bookworm AS build\n\
        RUN cargo build \\\n  --locked\n\
        FROM nvcr.io/nvidia/k8s/container-toolkit:v1.18.1 AS toolkit\n\
        FROM gcr.io/distroless/cc-debian12\n\
        COPY --from=build /out/a /usr/bin/a\n\
        COPY --chmod=0755 --from=toolkit /x/y /z/ /usr/bin/\n\
        COPY LICENSE /\n";

    #[test]
    fn stages_and_copies() {
        assert_eq!(
            stages(TEXT),
            [
                Stage {
                    image: "rust:1.95.0-bookworm".into(),
                    name: Some("build".into())
                },
                Stage {
                    image: "nvcr.io/nvidia/k8s/container-toolkit:v1.18.1".into(),
                    name: Some("toolkit".into())
                },
                Stage {
                    image: "gcr.io/distroless/cc-debian12".into(),
                    name: None
                },
            ]
        );
        let copies = copies_from(TEXT);
        assert_eq!(copies.len(), 2);
        assert_eq!(copies[1].from, "toolkit");
        assert_eq!(copies[1].sources, ["/x/y", "/z/"]);
        assert_eq!(copies[1].destination, "/usr/bin/");
        assert_eq!(
            image_of(TEXT, "toolkit"),
            "nvcr.io/nvidia/k8s/container-toolkit:v1.18.1"
        );
        assert_eq!(image_of(TEXT, "busybox:1.36.1"), "busybox:1.36.1");
    }

    #[test]
    fn pinned_images() {
        assert!(is_pinned("nvcr.io/nvidia/k8s/container-toolkit:v1.18.1"));
        assert!(is_pinned("docker.io/library/rust:1.95.0-bookworm"));
        assert!(is_pinned("registry:5000/img@sha256:abc"));
        assert!(!is_pinned("nvcr.io/nvidia/k8s/container-toolkit:latest"));
        assert!(!is_pinned("nvcr.io/nvidia/k8s/container-toolkit:v1.18"));
        assert!(!is_pinned("registry:5000/img"));
    }
}
