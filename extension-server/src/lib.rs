//! The files of a built Rancher UI extension, laid out as Rancher's UIPlugin
//! controller reads an extension's endpoint: it fetches
//! `<endpoint>/plugin/package.json` (whose `version` must equal the UIPlugin's),
//! then `<endpoint>/files.txt` (one `plugin/<path>` per line), then every file
//! that names, and caches them; the dashboard then loads
//! `plugin/<name>-<version>.umd.min.js` and its chunks. Knows nothing of
//! Kubernetes or of the changelog API: a read-only set of files held in memory,
//! loaded once at start, answered by exact path (no file system access per
//! request, so no path can reach outside them).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use bytes::Bytes;
use http::{Method, Response, StatusCode, header};
use http_body_util::Full;

/// Bounds on what [`Files::load`] accepts.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Most files.
    pub max_files: usize,
    /// Most bytes in all.
    pub max_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_files: 1000,
            max_bytes: 64 << 20,
        }
    }
}

/// Why a directory could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A file or directory could not be read.
    #[error("reading {path}")]
    Read {
        /// What was read.
        path: PathBuf,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// A file name is not UTF-8, or holds a character that files.txt cannot carry.
    #[error("file name {0} is not a plain UTF-8 path")]
    Name(PathBuf),
    /// More files than [`Limits::max_files`].
    #[error("more than {0} files")]
    TooManyFiles(usize),
    /// More bytes than [`Limits::max_bytes`].
    #[error("more than {0} bytes of files")]
    TooLarge(u64),
    /// No `package.json` at the top: not a built extension.
    #[error("{0} holds no package.json: not a built extension (dist-pkg/<name>-<version>)")]
    NoPackageJson(PathBuf),
}

/// One file: its bytes and media type.
#[derive(Clone, Debug)]
pub struct File {
    /// The content.
    pub body: Bytes,
    /// The `Content-Type` it is served with.
    pub content_type: &'static str,
}

/// The files of one built extension, by URL path (`/plugin/...`, `/files.txt`).
#[derive(Clone, Debug)]
pub struct Files {
    by_path: BTreeMap<String, File>,
}

/// Files of a build that are not part of the extension: the bundle analyzer's
/// report (Rancher's publish script drops it too).
const SKIPPED: &[&str] = &["report.html"];

impl Files {
    /// Loads every regular file under `dir` (a `dist-pkg/<name>-<version>`
    /// folder of the shell's `build-pkg`), skipping hidden files, symbolic
    /// links and the bundle report, and adds `files.txt`.
    pub fn load(dir: &Path, limits: Limits) -> Result<Self, LoadError> {
        let mut found = Vec::new();
        walk(dir, dir, &mut found)?;
        found.sort();
        if !found.iter().any(|(name, _)| name == "package.json") {
            return Err(LoadError::NoPackageJson(dir.to_owned()));
        }
        if found.len() > limits.max_files {
            return Err(LoadError::TooManyFiles(limits.max_files));
        }
        let mut by_path = BTreeMap::new();
        let mut total = 0u64;
        let mut listing = String::new();
        for (name, path) in found {
            let body = std::fs::read(&path).map_err(|source| LoadError::Read {
                path: path.clone(),
                source,
            })?;
            total += body.len() as u64;
            if total > limits.max_bytes {
                return Err(LoadError::TooLarge(limits.max_bytes));
            }
            listing.push_str("plugin/");
            listing.push_str(&name);
            listing.push('\n');
            by_path.insert(
                format!("/plugin/{name}"),
                File {
                    body: Bytes::from(body),
                    content_type: content_type(&name),
                },
            );
        }
        by_path.insert(
            "/files.txt".to_owned(),
            File {
                body: Bytes::from(listing),
                content_type: "text/plain; charset=utf-8",
            },
        );
        Ok(Self { by_path })
    }

    /// The file served at `path` (a URL path without query).
    pub fn get(&self, path: &str) -> Option<&File> {
        self.by_path.get(path)
    }

    /// Every served path, `files.txt` included.
    pub fn paths(&self) -> impl Iterator<Item = &str> {
        self.by_path.keys().map(String::as_str)
    }
}

fn walk(root: &Path, dir: &Path, found: &mut Vec<(String, PathBuf)>) -> Result<(), LoadError> {
    let read_error = |source| LoadError::Read {
        path: dir.to_owned(),
        source,
    };
    for entry in std::fs::read_dir(dir).map_err(read_error)? {
        let entry = entry.map_err(read_error)?;
        let path = entry.path();
        let file_name = entry.file_name();
        let Some(file_name) = file_name.to_str() else {
            return Err(LoadError::Name(path));
        };
        if file_name.starts_with('.') {
            continue;
        }
        let kind = entry.file_type().map_err(|source| LoadError::Read {
            path: path.clone(),
            source,
        })?;
        if kind.is_dir() {
            walk(root, &path, found)?;
        } else if kind.is_file() {
            let relative = path
                .strip_prefix(root)
                .ok()
                .and_then(Path::to_str)
                .ok_or_else(|| LoadError::Name(path.clone()))?
                .to_owned();
            if relative
                .chars()
                .any(|c| c.is_control() || c == '%' || c == '?' || c == '#')
            {
                return Err(LoadError::Name(path));
            }
            if !SKIPPED.contains(&relative.as_str()) {
                found.push((relative, path));
            }
        }
    }
    Ok(())
}

/// The media type of a file of a built extension, by its extension.
pub fn content_type(name: &str) -> &'static str {
    let extension = name.rsplit_once('.').map(|(_, e)| e).unwrap_or_default();
    match extension.to_ascii_lowercase().as_str() {
        "js" | "mjs" => "application/javascript; charset=utf-8",
        "json" | "map" => "application/json",
        "css" => "text/css; charset=utf-8",
        "html" => "text/html; charset=utf-8",
        "txt" | "md" => "text/plain; charset=utf-8",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "ico" => "image/x-icon",
        "woff" => "font/woff",
        "woff2" => "font/woff2",
        "ttf" => "font/ttf",
        "eot" => "application/vnd.ms-fontobject",
        "yaml" | "yml" => "application/yaml",
        _ => "application/octet-stream",
    }
}

/// The answer to one request: `GET`/`HEAD` of a served path, `/healthz`; 404
/// for other paths, 405 for other methods. Every answer, errors included, carries
/// `X-Content-Type-Options: nosniff`: a browser never guesses another type than the one sent.
pub fn respond(files: &Files, method: &Method, path: &str) -> Response<Full<Bytes>> {
    let mut response = answer(files, method, path);
    response.headers_mut().insert(
        header::X_CONTENT_TYPE_OPTIONS,
        http::HeaderValue::from_static("nosniff"),
    );
    response
}

fn answer(files: &Files, method: &Method, path: &str) -> Response<Full<Bytes>> {
    let head = method == Method::HEAD;
    if method != Method::GET && !head {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n")
            .map(|mut response| {
                response
                    .headers_mut()
                    .insert(header::ALLOW, http::HeaderValue::from_static("GET, HEAD"));
                response
            })
            .unwrap_or_else(|()| fallback());
    }
    if path == "/healthz" {
        return plain(StatusCode::OK, "ok\n").unwrap_or_else(|()| fallback());
    }
    let Some(file) = files.get(path) else {
        return plain(StatusCode::NOT_FOUND, "not found\n").unwrap_or_else(|()| fallback());
    };
    let body = if head {
        Bytes::new()
    } else {
        file.body.clone()
    };
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, file.content_type)
        .header(header::CONTENT_LENGTH, file.body.len())
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Full::new(body))
        .unwrap_or_else(|_| fallback())
}

fn plain(status: StatusCode, text: &'static str) -> Result<Response<Full<Bytes>>, ()> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Full::new(Bytes::from_static(text.as_bytes())))
        .map_err(|_| ())
}

fn fallback() -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt as _;

    fn built() -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("temp dir");
        let write = |name: &str, body: &str| {
            let path = dir.path().join(name);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(path, body).expect("write");
        };
        write("package.json", r#"{"name":"x","version":"1.2.3"}"#);
        write("x-1.2.3.umd.min.js", "var a=1;");
        write("x-1.2.3.umd.min.1.js", "var b=2;");
        write("img/logo.svg", "<svg/>");
        write("report.html", "<html/>");
        write(".hidden", "no");
        dir
    }

    async fn body(response: Response<Full<Bytes>>) -> Bytes {
        response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes()
    }

    #[tokio::test]
    async fn serves_every_file_under_plugin_and_lists_them() {
        let dir = built();
        let files = Files::load(dir.path(), Limits::default()).expect("load");
        let listing = body(respond(&files, &Method::GET, "/files.txt")).await;
        assert_eq!(
            listing,
            "plugin/img/logo.svg\nplugin/package.json\nplugin/x-1.2.3.umd.min.1.js\nplugin/x-1.2.3.umd.min.js\n"
        );
        for line in std::str::from_utf8(&listing).expect("utf-8").lines() {
            let response = respond(&files, &Method::GET, &format!("/{line}"));
            assert_eq!(response.status(), StatusCode::OK, "{line}");
        }
        let js = respond(&files, &Method::GET, "/plugin/x-1.2.3.umd.min.js");
        assert_eq!(
            js.headers()[header::CONTENT_TYPE],
            "application/javascript; charset=utf-8"
        );
        assert_eq!(body(js).await, "var a=1;");
        let json = respond(&files, &Method::HEAD, "/plugin/package.json");
        assert_eq!(json.headers()[header::CONTENT_TYPE], "application/json");
        assert_eq!(json.headers()[header::CONTENT_LENGTH], "30");
        assert!(body(json).await.is_empty());
    }

    #[test]
    fn refuses_what_it_does_not_serve() {
        let dir = built();
        let files = Files::load(dir.path(), Limits::default()).expect("load");
        for path in [
            "/plugin/report.html",
            "/plugin/.hidden",
            "/plugin/../package.json",
            "/package.json",
            "/plugin/",
            "/",
        ] {
            assert_eq!(
                respond(&files, &Method::GET, path).status(),
                StatusCode::NOT_FOUND,
                "{path}"
            );
        }
        let post = respond(&files, &Method::POST, "/files.txt");
        assert_eq!(post.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(post.headers()[header::ALLOW], "GET, HEAD");
    }

    #[test]
    fn every_answer_says_nosniff() {
        let dir = built();
        let files = Files::load(dir.path(), Limits::default()).expect("load");
        for (method, path) in [
            (Method::GET, "/files.txt"),
            (Method::HEAD, "/files.txt"),
            (Method::GET, "/healthz"),
            (Method::GET, "/nothing"),
            (Method::POST, "/files.txt"),
        ] {
            let response = respond(&files, &method, path);
            assert_eq!(
                response.headers()[header::X_CONTENT_TYPE_OPTIONS],
                "nosniff",
                "{method} {path}: {}",
                response.status()
            );
        }
    }

    #[test]
    fn load_is_bounded_and_needs_a_package_json() {
        let dir = built();
        let few = Limits {
            max_files: 2,
            ..Limits::default()
        };
        assert!(matches!(
            Files::load(dir.path(), few),
            Err(LoadError::TooManyFiles(2))
        ));
        let small = Limits {
            max_bytes: 10,
            ..Limits::default()
        };
        assert!(matches!(
            Files::load(dir.path(), small),
            Err(LoadError::TooLarge(10))
        ));
        let empty = tempfile::tempdir().expect("temp dir");
        assert!(matches!(
            Files::load(empty.path(), Limits::default()),
            Err(LoadError::NoPackageJson(_))
        ));
    }

    #[test]
    fn content_types() {
        assert_eq!(
            content_type("a.umd.min.js"),
            "application/javascript; charset=utf-8"
        );
        assert_eq!(content_type("a.JSON"), "application/json");
        assert_eq!(content_type("f.woff2"), "font/woff2");
        assert_eq!(content_type("noextension"), "application/octet-stream");
    }
}
