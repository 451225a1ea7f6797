//! The HTTP face: routing Kubernetes URLs, query parameters, bodies, discovery and responses.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use bytes::Bytes;
use futures::StreamExt as _;
use http::header::{ACCEPT, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use http::request::Parts;
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::Serialize;
use serde_json::{Map, Value, json};
use tracing::debug;

use super::Shared;
use super::faults::Injected;
use super::object::{partial_metadata, with_type_meta};
use super::resources::ResourceType;
use super::selectors::{FieldSelector, Filter, LabelSelector};
use super::stats::Verb;
use super::status::ApiError;
use super::store::{ListAt, PatchBody, Preconditions, WriteCtx};
use super::watch::{self, WatchSpec, WatchStart};

/// The real server's request body limit (3 MiB).
const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;
/// Watch length when the client sets no `timeoutSeconds` (the real server picks 30–60 minutes).
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);
/// How long a [reset](super::Fault::reset_mid_body) answer stays open after its first bytes.
const RESET_DELAY: Duration = Duration::from_millis(20);
const AGGREGATED_DISCOVERY: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new().fallback(handle).with_state(shared)
}

async fn handle(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let response = match route(&shared, parts.uri.path()) {
        Route::Version => json_response(StatusCode::OK, &version_info(&shared.git_version)),
        Route::Health => response_with(
            StatusCode::OK,
            "text/plain; charset=utf-8",
            Body::from("ok"),
        ),
        Route::Discovery(target) => discovery(&shared, &parts.headers, &target),
        Route::Resource(target) => resource_request(&shared, &parts, body, target).await,
        Route::Unknown => error_response(&ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )),
    };
    debug!(method = %parts.method, uri = %parts.uri, status = response.status().as_u16(), "fake API server request");
    response
}

/// A resource URL taken apart.
#[derive(Debug)]
struct Target {
    rt: ResourceType,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
}

#[derive(Debug)]
enum DiscoveryTarget {
    /// `/api`
    CoreVersions,
    /// `/apis`
    Groups,
    /// `/apis/<group>`
    Group(String),
    /// `/api/v1` or `/apis/<group>/<version>`
    Resources { group: String, version: String },
}

#[derive(Debug)]
enum Route {
    Version,
    /// `/healthz`, `/livez`, `/readyz`
    Health,
    Discovery(DiscoveryTarget),
    Resource(Target),
    Unknown,
}

fn route(shared: &Shared, path: &str) -> Route {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let serves_version = |group: &str, version: &str| {
        shared
            .resources
            .iter()
            .any(|rt| rt.group == group && rt.version == version)
    };
    match segments.as_slice() {
        ["version"] => Route::Version,
        ["healthz" | "livez" | "readyz"] => Route::Health,
        ["api"] => Route::Discovery(DiscoveryTarget::CoreVersions),
        ["apis"] => Route::Discovery(DiscoveryTarget::Groups),
        ["apis", group] if shared.resources.iter().any(|rt| rt.group == *group) => {
            Route::Discovery(DiscoveryTarget::Group((*group).to_string()))
        }
        ["api", version] if serves_version("", version) => {
            Route::Discovery(DiscoveryTarget::Resources {
                group: String::new(),
                version: (*version).to_string(),
            })
        }
        ["apis", group, version] if serves_version(group, version) => {
            Route::Discovery(DiscoveryTarget::Resources {
                group: (*group).to_string(),
                version: (*version).to_string(),
            })
        }
        ["api", version, rest @ ..] => resource_route(shared, "", version, rest),
        ["apis", group, version, rest @ ..] => resource_route(shared, group, version, rest),
        _ => Route::Unknown,
    }
}

fn resource_route(shared: &Shared, group: &str, version: &str, rest: &[&str]) -> Route {
    let find = |plural: &str| {
        shared
            .resources
            .iter()
            .find(|rt| rt.group == group && rt.version == version && rt.plural == plural)
    };
    let target = |rt: &ResourceType, namespace: Option<&str>, tail: &[&str]| {
        if tail.len() > 2 {
            return Route::Unknown;
        }
        Route::Resource(Target {
            rt: rt.clone(),
            namespace: namespace.map(str::to_string),
            name: tail.first().map(|s| (*s).to_string()),
            subresource: tail.get(1).map(|s| (*s).to_string()),
        })
    };
    match rest {
        ["namespaces", namespace, plural, tail @ ..]
            if find(plural).is_some_and(|rt| rt.namespaced) =>
        {
            find(plural).map_or(Route::Unknown, |rt| target(rt, Some(namespace), tail))
        }
        [plural, tail @ ..] => match find(plural) {
            // A namespaced object needs its namespace in the path; only lists span namespaces.
            Some(rt) if rt.namespaced && !tail.is_empty() => Route::Unknown,
            Some(rt) => target(rt, None, tail),
            None => Route::Unknown,
        },
        [] => Route::Unknown,
    }
}

/// Query parameters, first occurrence wins.
struct Query(Vec<(String, String)>);

impl Query {
    fn parse(parts: &Parts) -> Result<Self, ApiError> {
        axum::extract::Query::<Vec<(String, String)>>::try_from_uri(&parts.uri)
            .map(|q| Self(q.0))
            .map_err(|e| ApiError::bad_request(format!("invalid query string: {e}")))
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1"))
    }

    fn dry_run(&self) -> Result<bool, ApiError> {
        match self.get("dryRun") {
            None | Some("") => Ok(false),
            Some("All") => Ok(true),
            Some(other) => Err(ApiError::bad_request(format!(
                "unsupported dryRun value: \"{other}\""
            ))),
        }
    }

    fn filter(&self, rt: &ResourceType, namespace: Option<&str>) -> Result<Filter, ApiError> {
        let fields = FieldSelector::parse(self.get("fieldSelector").unwrap_or_default(), rt)
            .map_err(ApiError::bad_request)?;
        let labels = LabelSelector::parse(self.get("labelSelector").unwrap_or_default())
            .map_err(ApiError::bad_request)?;
        Ok(Filter {
            namespace: namespace.map(str::to_string),
            fields,
            labels,
        })
    }
}

fn verb_of(method: &Method, target: &Target, watch: bool) -> Result<Verb, ApiError> {
    let not_allowed = || {
        ApiError::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
    };
    if let Some(subresource) = &target.subresource {
        if subresource != "status" || !target.rt.has_status_subresource() {
            return Err(ApiError::new(
                404,
                "NotFound",
                "the server could not find the requested resource",
            ));
        }
        return match *method {
            Method::GET => Ok(Verb::Get),
            Method::PUT => Ok(Verb::Update),
            Method::PATCH => Ok(Verb::Patch),
            _ => Err(not_allowed()),
        };
    }
    match (method, target.name.is_some()) {
        (&Method::GET, true) => Ok(Verb::Get),
        (&Method::GET, false) if watch => Ok(Verb::Watch),
        (&Method::GET, false) => Ok(Verb::List),
        (&Method::POST, false) => Ok(Verb::Create),
        (&Method::PUT, true) => Ok(Verb::Update),
        (&Method::PATCH, true) => Ok(Verb::Patch),
        (&Method::DELETE, true) => Ok(Verb::Delete),
        (&Method::DELETE, false) if target.rt.delete_collection => Ok(Verb::DeleteCollection),
        _ => Err(not_allowed()),
    }
}

async fn resource_request(
    shared: &Arc<Shared>,
    parts: &Parts,
    body: Body,
    target: Target,
) -> Response {
    let query = match Query::parse(parts) {
        Ok(query) => query,
        Err(error) => return error_response(&error),
    };
    let verb = match verb_of(&parts.method, &target, query.flag("watch")) {
        Ok(verb) => verb,
        Err(error) => return error_response(&error),
    };
    let resource = match &target.subresource {
        Some(sub) => format!("{}/{sub}", target.rt.plural),
        None => target.rt.plural.to_string(),
    };
    shared.record(&resource, verb);
    let latency = shared.faults.latency();
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let injected = match shared.faults.take(verb, &resource) {
        Some(Injected::Fail(error)) => return error_response(&error),
        Some(Injected::ResetMidBody) => true,
        Some(Injected::Delay(delay)) => {
            tokio::time::sleep(delay).await;
            false
        }
        None => false,
    };
    let body = match read_body(body).await {
        Ok(body) => body,
        Err(error) => return error_response(&error),
    };
    let request = ResourceRequest {
        shared,
        target: &target,
        query: &query,
        headers: &parts.headers,
        metadata_only: wants_metadata(&parts.headers),
    };
    let response = match request.dispatch(verb, &body) {
        Ok(response) => response,
        Err(error) => error_response(&error),
    };
    if injected {
        cut_mid_body(response)
    } else {
        response
    }
}

/// Sends the status line, the headers and the first half of the body's first chunk (all of a
/// plain answer, the first events of a watch), then fails the body so that hyper drops the
/// connection without ending the message: the client reads a truncated body, as after a reset.
fn cut_mid_body(response: Response) -> Response {
    let (mut parts, body) = response.into_parts();
    // Chunked instead of a length, so the cut is an incomplete message whatever the size.
    parts.headers.remove(CONTENT_LENGTH);
    let mut frames = body.into_data_stream();
    let start = futures::stream::once(async move {
        let first = match frames.next().await {
            Some(Ok(bytes)) => bytes.slice(..bytes.len().div_ceil(2)),
            _ => Bytes::new(),
        };
        Ok::<_, std::io::Error>(first)
    });
    let reset = futures::stream::once(async {
        // Give hyper time to put the start on the wire before the connection goes.
        tokio::time::sleep(RESET_DELAY).await;
        Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "injected fault: connection reset mid-body",
        ))
    });
    Response::from_parts(parts, Body::from_stream(start.chain(reset)))
}

async fn read_body(body: Body) -> Result<Bytes, ApiError> {
    match Limited::new(body, MAX_BODY_BYTES).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<LengthLimitError>() => Err(ApiError::new(
            413,
            "RequestEntityTooLarge",
            format!("Request entity too large: limit is {MAX_BODY_BYTES}"),
        )),
        Err(error) => Err(ApiError::bad_request(format!(
            "failed to read the request body: {error}"
        ))),
    }
}

fn wants_metadata(headers: &HeaderMap) -> bool {
    headers
        .get_all(ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|accept| accept.contains("as=PartialObjectMetadata"))
}

fn parse_json(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}"))
    })
}

struct ResourceRequest<'a> {
    shared: &'a Arc<Shared>,
    target: &'a Target,
    query: &'a Query,
    headers: &'a HeaderMap,
    metadata_only: bool,
}

impl ResourceRequest<'_> {
    fn dispatch(&self, verb: Verb, body: &[u8]) -> Result<Response, ApiError> {
        let rt = &self.target.rt;
        let namespace = self.target.namespace.as_deref();
        let name = self.target.name.as_deref().unwrap_or_default();
        let status = self.target.subresource.is_some();
        let hooks = self.shared.hooks_for(rt.plural);
        let ctx = WriteCtx {
            rt,
            namespace,
            dry_run: self.query.dry_run()?,
            hooks: &hooks,
        };
        match verb {
            Verb::Get => {
                let obj = self.shared.state().get(rt, namespace, name)?;
                Ok(self.object_response(StatusCode::OK, &obj))
            }
            Verb::List => self.list(),
            Verb::Watch => self.watch(),
            Verb::Create => {
                let obj = self.shared.state().create(&ctx, parse_json(body)?)?;
                Ok(self.object_response(StatusCode::CREATED, &obj))
            }
            Verb::Update => {
                let obj = self
                    .shared
                    .state()
                    .replace(&ctx, name, parse_json(body)?, status)?;
                Ok(self.object_response(StatusCode::OK, &obj))
            }
            Verb::Patch => {
                let patch = self.patch_body(body)?;
                let (obj, created) = self.shared.state().patch(&ctx, name, patch, status)?;
                let code = if created {
                    StatusCode::CREATED
                } else {
                    StatusCode::OK
                };
                Ok(self.object_response(code, &obj))
            }
            Verb::Delete => {
                let (preconditions, dry_run) = delete_options(body)?;
                let ctx = WriteCtx {
                    dry_run: ctx.dry_run || dry_run,
                    ..ctx
                };
                let (obj, gone) = self.shared.state().delete(&ctx, name, &preconditions)?;
                if gone && !rt.returns_deleted_object {
                    let uid = obj.pointer("/metadata/uid").cloned().unwrap_or(Value::Null);
                    let status = json!({
                        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                        "details": {"name": name, "group": rt.group, "kind": rt.plural, "uid": uid},
                    });
                    return Ok(json_response(StatusCode::OK, &status));
                }
                Ok(self.object_response(StatusCode::OK, &obj))
            }
            Verb::DeleteCollection => {
                let (_, dry_run) = delete_options(body)?;
                let ctx = WriteCtx {
                    dry_run: ctx.dry_run || dry_run,
                    ..ctx
                };
                let filter = self.query.filter(rt, namespace)?;
                let mut state = self.shared.state();
                let deleted = state.delete_collection(&ctx, &filter)?;
                let rv = state.resource_version();
                drop(state);
                Ok(self.list_response(&deleted, rv))
            }
        }
    }

    fn list(&self) -> Result<Response, ApiError> {
        let rt = &self.target.rt;
        let filter = self.query.filter(rt, self.target.namespace.as_deref())?;
        let rv = self
            .query
            .get("resourceVersion")
            .filter(|rv| !rv.is_empty());
        let at = match (self.query.get("resourceVersionMatch"), rv) {
            (None | Some(""), _) | (Some("NotOlderThan"), Some(_)) => ListAt::Latest,
            (Some("Exact"), Some(rv)) => ListAt::Exact(parse_rv(rv)?),
            (Some(other @ ("Exact" | "NotOlderThan")), None) => {
                return Err(invalid_list_options(&format!(
                    "resourceVersionMatch: Forbidden: resourceVersionMatch \"{other}\" is forbidden unless resourceVersion is provided"
                )));
            }
            (Some(other), _) => {
                return Err(invalid_list_options(&format!(
                    "resourceVersionMatch: Unsupported value: \"{other}\": supported values: \"Exact\", \"NotOlderThan\""
                )));
            }
        };
        if let Some(rv) = rv {
            parse_rv(rv)?;
        }
        let (items, rv) = self.shared.state().list(rt, &filter, at)?;
        Ok(self.list_response(&items, rv))
    }

    fn watch(&self) -> Result<Response, ApiError> {
        let rt = &self.target.rt;
        let filter = self.query.filter(rt, self.target.namespace.as_deref())?;
        let bookmarks = self.query.flag("allowWatchBookmarks");
        let send_initial_events = match self.query.get("sendInitialEvents") {
            None => None,
            Some("true" | "1") => Some(true),
            Some("false" | "0") => Some(false),
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "invalid sendInitialEvents value: \"{other}\""
                )));
            }
        };
        let version_match = self
            .query
            .get("resourceVersionMatch")
            .filter(|m| !m.is_empty());
        // The same combinations the real server refuses (ValidateListOptions).
        match (send_initial_events, version_match) {
            (Some(_), m) if m != Some("NotOlderThan") => {
                return Err(invalid_list_options(
                    "resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                ));
            }
            (Some(_), _) if !bookmarks => {
                return Err(invalid_list_options(
                    "allowWatchBookmarks: Forbidden: sendInitialEvents requires setting allowWatchBookmarks to true",
                ));
            }
            (None, Some(_)) => {
                return Err(invalid_list_options(
                    "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                ));
            }
            _ => {}
        }
        let rv = self
            .query
            .get("resourceVersion")
            .filter(|rv| !rv.is_empty() && *rv != "0");
        // sendInitialEvents defaults to true without a resourceVersion (or with "0") and to
        // false otherwise; explicitly false without one means "from now on".
        let start = match (send_initial_events, rv) {
            (Some(true), _) | (None, None) => WatchStart::Snapshot,
            (_, Some(rv)) => WatchStart::After(parse_rv(rv)?),
            (Some(false), None) => WatchStart::After(self.shared.state().resource_version()),
        };
        // Like the real server, a zero timeout means the default one.
        let timeout = match self.query.get("timeoutSeconds") {
            None | Some("") => DEFAULT_WATCH_TIMEOUT,
            Some(secs) => match secs.parse::<u64>() {
                Ok(0) => DEFAULT_WATCH_TIMEOUT,
                Ok(secs) => Duration::from_secs(secs),
                Err(_) => {
                    return Err(ApiError::bad_request(format!(
                        "invalid timeoutSeconds: \"{secs}\""
                    )));
                }
            },
        };
        let spec = WatchSpec {
            rt: rt.clone(),
            filter,
            start,
            bookmarks,
            initial_events_end: send_initial_events == Some(true),
            timeout,
            metadata_only: self.metadata_only,
        };
        let body = watch::spawn(self.shared.clone(), spec);
        Ok(response_with(StatusCode::OK, "application/json", body))
    }

    fn patch_body(&self, body: &[u8]) -> Result<PatchBody, ApiError> {
        let content_type = self
            .headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .map(str::trim)
            .unwrap_or_default();
        match content_type {
            "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
                Ok(PatchBody::Merge(parse_json(body)?))
            }
            "application/json-patch+json" => serde_json::from_slice(body)
                .map(PatchBody::Json)
                .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}"))),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => {
                let manager = self.query.get("fieldManager").filter(|m| !m.is_empty()).ok_or_else(|| {
                    ApiError::new(
                        422,
                        "Invalid",
                        "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
                    )
                })?;
                let config = serde_json::from_slice(body).map_err(|e| {
                    ApiError::bad_request(format!(
                        "the fake API server accepts JSON apply patches only (YAML is not parsed): {e}"
                    ))
                })?;
                Ok(PatchBody::Apply {
                    config,
                    manager: manager.to_string(),
                })
            }
            other => Err(ApiError::new(
                415,
                "UnsupportedMediaType",
                format!(
                    "the body of the request was in an unknown format ({other}) - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
                ),
            )),
        }
    }

    fn object_response(&self, code: StatusCode, stored: &Value) -> Response {
        let body = if self.metadata_only {
            partial_metadata(stored)
        } else {
            with_type_meta(stored, &self.target.rt.api_version(), self.target.rt.kind)
        };
        json_response(code, &body)
    }

    /// A list: items without `apiVersion`/`kind`, as the real server sends them.
    fn list_response(&self, items: &[Arc<Value>], rv: u64) -> Response {
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct List<'a> {
            kind: String,
            api_version: String,
            metadata: Value,
            items: Vec<&'a Value>,
        }
        let metadata = json!({"resourceVersion": rv.to_string()});
        if self.metadata_only {
            let items: Vec<Value> = items.iter().map(|obj| partial_metadata(obj)).collect();
            let list = List {
                kind: "PartialObjectMetadataList".into(),
                api_version: "meta.k8s.io/v1".into(),
                metadata,
                items: items.iter().collect(),
            };
            return json_response(StatusCode::OK, &list);
        }
        let rt = &self.target.rt;
        let list = List {
            kind: format!("{}List", rt.kind),
            api_version: rt.api_version(),
            metadata,
            items: items.iter().map(AsRef::as_ref).collect(),
        };
        json_response(StatusCode::OK, &list)
    }
}

fn parse_rv(rv: &str) -> Result<u64, ApiError> {
    rv.parse()
        .map_err(|_| ApiError::bad_request(format!("invalid resource version: \"{rv}\"")))
}

fn invalid_list_options(detail: &str) -> ApiError {
    ApiError::new(
        422,
        "Invalid",
        format!("ListOptions.meta.k8s.io \"\" is invalid: {detail}"),
    )
}

/// `DeleteOptions` from a DELETE body: preconditions and dry run. An empty body is allowed.
fn delete_options(body: &[u8]) -> Result<(Preconditions, bool), ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok((Preconditions::default(), false));
    }
    let options = parse_json(body)?;
    let text = |pointer: &str| {
        options
            .pointer(pointer)
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let preconditions = Preconditions {
        uid: text("/preconditions/uid"),
        resource_version: text("/preconditions/resourceVersion"),
    };
    let dry_run = options
        .get("dryRun")
        .and_then(Value::as_array)
        .is_some_and(|values| values.iter().any(|v| v == "All"));
    Ok((preconditions, dry_run))
}

fn response_with(code: StatusCode, content_type: &'static str, body: Body) -> Response {
    let mut response = Response::new(body);
    *response.status_mut() = code;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

fn json_response<T: Serialize + ?Sized>(code: StatusCode, body: &T) -> Response {
    match serde_json::to_vec(body) {
        Ok(bytes) => response_with(code, "application/json", Body::from(bytes)),
        Err(error) => error_response(&ApiError::internal(format!(
            "failed to encode the response: {error}"
        ))),
    }
}

fn error_response(error: &ApiError) -> Response {
    let code = StatusCode::from_u16(error.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let bytes = serde_json::to_vec(&error.to_status()).unwrap_or_default();
    let mut response = response_with(code, "application/json", Body::from(bytes));
    if let Some(seconds) = error.retry_after {
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}

fn version_info(git_version: &str) -> Value {
    let numbers: Vec<&str> = git_version
        .trim_start_matches('v')
        .split(['.', '-', '+'])
        .collect();
    let major = numbers.first().copied().unwrap_or("1");
    let minor = numbers.get(1).copied().unwrap_or("0");
    let min_compat_minor = minor
        .parse::<u32>()
        .map_or_else(|_| minor.to_string(), |m| m.saturating_sub(1).to_string());
    json!({
        "major": major,
        "minor": minor,
        "emulationMajor": major,
        "emulationMinor": minor,
        "minCompatibilityMajor": major,
        "minCompatibilityMinor": min_compat_minor,
        "gitVersion": git_version,
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.25.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// Orders versions the way discovery prefers them: GA before beta before alpha, newer first.
fn version_priority(version: &str) -> (u8, u32, u32) {
    let Some(rest) = version.strip_prefix('v') else {
        return (0, 0, 0);
    };
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let major = digits.parse().unwrap_or(0);
    let suffix = &rest[digits.len()..];
    let (stage, minor) = if let Some(n) = suffix.strip_prefix("beta") {
        (2, n.parse().unwrap_or(0))
    } else if let Some(n) = suffix.strip_prefix("alpha") {
        (1, n.parse().unwrap_or(0))
    } else if suffix.is_empty() {
        (3, 0)
    } else {
        (0, 0)
    };
    (stage, major, minor)
}

fn discovery(shared: &Shared, headers: &HeaderMap, target: &DiscoveryTarget) -> Response {
    let aggregated = headers
        .get_all(ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|accept| accept.contains("as=APIGroupDiscoveryList"));
    let resources = &shared.resources;
    // Served versions per group, preferred first.
    let versions_of = |group: &str| {
        let mut versions: Vec<&'static str> = resources
            .iter()
            .filter(|rt| rt.group == group)
            .map(|rt| rt.version)
            .collect();
        versions.sort_by_key(|v| std::cmp::Reverse(version_priority(v)));
        versions.dedup();
        versions
    };
    let mut groups: Vec<&'static str> = resources
        .iter()
        .map(|rt| rt.group)
        .filter(|g| !g.is_empty())
        .collect();
    groups.sort_unstable();
    groups.dedup();
    let group_json = |group: &str| {
        let versions: Vec<Value> = versions_of(group)
            .iter()
            .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
            .collect();
        json!({"name": group, "versions": versions, "preferredVersion": versions.first().cloned().unwrap_or(Value::Null)})
    };
    match target {
        DiscoveryTarget::CoreVersions if aggregated => {
            let list = aggregated_list(resources, &[""], &versions_of);
            response_with(
                StatusCode::OK,
                AGGREGATED_DISCOVERY,
                Body::from(serde_json::to_vec(&list).unwrap_or_default()),
            )
        }
        DiscoveryTarget::Groups if aggregated => {
            let list = aggregated_list(resources, &groups, &versions_of);
            response_with(
                StatusCode::OK,
                AGGREGATED_DISCOVERY,
                Body::from(serde_json::to_vec(&list).unwrap_or_default()),
            )
        }
        DiscoveryTarget::CoreVersions => json_response(
            StatusCode::OK,
            &json!({
                "kind": "APIVersions",
                "versions": versions_of(""),
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": shared.addr.to_string()}],
            }),
        ),
        DiscoveryTarget::Groups => {
            let groups: Vec<Value> = groups.iter().map(|g| group_json(g)).collect();
            json_response(
                StatusCode::OK,
                &json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}),
            )
        }
        DiscoveryTarget::Group(group) => {
            let mut body = group_json(group);
            body["kind"] = json!("APIGroup");
            body["apiVersion"] = json!("v1");
            json_response(StatusCode::OK, &body)
        }
        DiscoveryTarget::Resources { group, version } => {
            let mut list = Vec::new();
            for rt in resources
                .iter()
                .filter(|rt| rt.group == group && rt.version == version)
            {
                let mut entry = json!({
                    "name": rt.plural,
                    "singularName": rt.singular(),
                    "namespaced": rt.namespaced,
                    "kind": rt.kind,
                    "verbs": rt.verbs(),
                });
                if !rt.short_names.is_empty() {
                    entry["shortNames"] = json!(rt.short_names);
                }
                list.push(entry);
                if rt.has_status_subresource() {
                    list.push(json!({
                        "name": format!("{}/status", rt.plural),
                        "singularName": "",
                        "namespaced": rt.namespaced,
                        "kind": rt.kind,
                        "verbs": ["get", "patch", "update"],
                    }));
                }
            }
            let group_version = if group.is_empty() {
                version.clone()
            } else {
                format!("{group}/{version}")
            };
            json_response(
                StatusCode::OK,
                &json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": list}),
            )
        }
    }
}

/// `APIGroupDiscoveryList` (aggregated discovery v2) for the given groups.
fn aggregated_list(
    resources: &[ResourceType],
    groups: &[&str],
    versions_of: &dyn Fn(&str) -> Vec<&'static str>,
) -> Value {
    let items: Vec<Value> = groups
        .iter()
        .map(|group| {
            let versions: Vec<Value> = versions_of(group)
                .into_iter()
                .map(|version| {
                    let kinds: Vec<Value> = resources
                        .iter()
                        .filter(|rt| rt.group == *group && rt.version == version)
                        .map(|rt| {
                            let gvk =
                                json!({"group": rt.group, "version": rt.version, "kind": rt.kind});
                            let mut entry = json!({
                                "resource": rt.plural,
                                "responseKind": gvk,
                                "scope": if rt.namespaced { "Namespaced" } else { "Cluster" },
                                "singularResource": rt.singular(),
                                "verbs": rt.verbs(),
                            });
                            if !rt.short_names.is_empty() {
                                entry["shortNames"] = json!(rt.short_names);
                            }
                            if rt.has_status_subresource() {
                                entry["subresources"] = json!([{
                                    "subresource": "status",
                                    "responseKind": gvk,
                                    "verbs": ["get", "patch", "update"],
                                }]);
                            }
                            entry
                        })
                        .collect();
                    json!({"version": version, "resources": kinds, "freshness": "Current"})
                })
                .collect();
            let mut metadata = Map::new();
            if !group.is_empty() {
                metadata.insert("name".into(), json!(group));
            }
            json!({"metadata": metadata, "versions": versions})
        })
        .collect();
    json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": items})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_priority_orders_like_kubernetes() {
        let mut versions = vec!["v1beta1", "v1alpha3", "v1", "v1beta2", "v2"];
        versions.sort_by_key(|v| std::cmp::Reverse(version_priority(v)));
        assert_eq!(versions, ["v2", "v1", "v1beta2", "v1beta1", "v1alpha3"]);
    }

    #[test]
    fn version_info_splits_git_version() {
        let info: k8s_openapi::apimachinery::pkg::version::Info =
            serde_json::from_value(version_info("v1.36.2")).unwrap();
        assert_eq!((info.major.as_str(), info.minor.as_str()), ("1", "36"));
        assert_eq!(info.git_version, "v1.36.2");
    }

    #[test]
    fn delete_options_parse() {
        let (pre, dry) = delete_options(
            br#"{"preconditions":{"uid":"u","resourceVersion":"7"},"dryRun":["All"]}"#,
        )
        .unwrap();
        assert_eq!(pre.uid.as_deref(), Some("u"));
        assert_eq!(pre.resource_version.as_deref(), Some("7"));
        assert!(dry);
        assert!(delete_options(b"").unwrap().0.uid.is_none());
        assert_eq!(delete_options(b"{").unwrap_err().code, 400);
    }
}
