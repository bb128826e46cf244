//! Extractors whose rejections are problem documents with the offending field named, instead of axum's
//! plain-text defaults.

use axum::body::Bytes;
use axum::extract::rejection::PathRejection;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::{header, request::Parts, HeaderMap, StatusCode};
use ringtrain_core::FieldError;
use serde::de::DeserializeOwned;

use crate::error::{ApiError, ProblemType};

/// Whether the request says its body is JSON (`application/json` or any `application/*+json`).
fn is_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) else { return false };
    let essence = value.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    essence == "application/json" || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// The raw bytes of a JSON request body, after the content type and the size limit were checked.
#[derive(Debug)]
pub struct JsonBytes(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for JsonBytes {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        if !is_json(req.headers()) {
            return Err(ApiError::new(
                ProblemType::UnsupportedMediaType,
                "the body must be JSON: send Content-Type: application/json",
            ));
        }
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            let status = rejection.status();
            if status == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(ProblemType::PayloadTooLarge, "the request body is larger than this route accepts")
            } else {
                ApiError::new(ProblemType::BadRequest, rejection.body_text())
            }
        })?;
        Ok(JsonBytes(bytes))
    }
}

/// Deserializes JSON: a syntax error is 400 (not JSON at all), a type error 422 naming the field's path.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    from_value(parse_value(bytes)?)
}

/// The body as a JSON value (400 when it is not JSON).
pub fn parse_value(bytes: &[u8]) -> Result<serde_json::Value, ApiError> {
    serde_json::from_slice(bytes)
        .map_err(|err| ApiError::new(ProblemType::MalformedJson, format!("the body is not valid JSON: {err}")))
}

/// A JSON value as `T`; 422 naming the path of what is wrong. A value `T` refuses only because a whole
/// number is written with a fraction (`3.0` for an integer field) is taken with it as the integer; numbers
/// `T` keeps as JSON (metric values, results) are kept exactly as sent.
pub fn from_value<T: DeserializeOwned>(value: serde_json::Value) -> Result<T, ApiError> {
    let first: Result<T, _> = serde_path_to_error::deserialize(&value);
    let err = match first {
        Ok(typed) => return Ok(typed),
        Err(err) => err,
    };
    let mut whole = value;
    if whole_numbers_as_integers(&mut whole) {
        if let Ok(typed) = serde_path_to_error::deserialize::<_, T>(&whole) {
            return Ok(typed);
        }
    }
    let path = err.path().to_string();
    let path = if path == "." { String::new() } else { path };
    Err(ApiError::validation(vec![FieldError::new(path, strip_position(&err.into_inner().to_string()))]))
}

/// JSON has one number type and JSON Schema's `integer` includes `2.0`: rewrites whole numbers written
/// with a fraction as integers; says whether there was any.
pub fn whole_numbers_as_integers(value: &mut serde_json::Value) -> bool {
    use serde_json::Value;
    match value {
        Value::Number(n) if n.is_f64() => {
            let f = n.as_f64().unwrap_or(f64::NAN);
            let whole = f.fract() == 0.0 && f.abs() < 9.0e15;
            if whole {
                *value = Value::from(f as i64);
            }
            whole
        }
        Value::Array(items) => items.iter_mut().map(whole_numbers_as_integers).fold(false, |a, b| a | b),
        Value::Object(fields) => fields.values_mut().map(whole_numbers_as_integers).fold(false, |a, b| a | b),
        _ => false,
    }
}

/// serde_json appends " at line L column C" to type errors; the path already says where.
fn strip_position(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(pos) => message[..pos].to_string(),
        None => message.to_string(),
    }
}

/// A JSON body deserialized into `T`.
#[derive(Debug)]
pub struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let JsonBytes(bytes) = JsonBytes::from_request(req, state).await?;
        let value = parse_value(&bytes)?;
        require_object(&value)?;
        Ok(JsonBody(from_value(value)?))
    }
}

/// Every body the API reads is a JSON object: serde would otherwise take a struct from an array of its
/// fields' values (`[null, null]`), which no client means.
pub fn require_object(value: &serde_json::Value) -> Result<(), ApiError> {
    if value.is_object() {
        Ok(())
    } else {
        Err(ApiError::validation(vec![FieldError::new("", "the body must be a JSON object")]))
    }
}

/// Path parameters; a malformed one (a bad UUID) is 400 naming the parameter.
#[derive(Debug)]
pub struct ApiPath<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(value)) => Ok(ApiPath(value)),
            Err(PathRejection::FailedToDeserializePathParams(err)) => {
                use axum::extract::path::ErrorKind;
                // A single parameter (`Path<Uuid>`) fails without its name: look it up in the route.
                let names: Vec<String> = match axum::extract::RawPathParams::from_request_parts(parts, state).await {
                    Ok(raw) => raw.iter().map(|(name, _)| name.to_string()).collect(),
                    Err(_) => Vec::new(),
                };
                let path = match err.kind() {
                    ErrorKind::ParseErrorAtKey { key, .. } | ErrorKind::InvalidUtf8InPathParam { key } => key.clone(),
                    ErrorKind::ParseErrorAtIndex { index, .. } => names.get(*index).cloned().unwrap_or_default(),
                    _ if names.len() == 1 => names[0].clone(),
                    _ => String::new(),
                };
                Err(ApiError::field(ProblemType::BadPathParameter, &path, err.body_text()))
            }
            Err(other) => Err(ApiError::internal_msg(other.body_text())),
        }
    }
}

/// Query parameters; a malformed one is 400 naming the parameter.
#[derive(Debug)]
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let query = parts.uri.query().unwrap_or("");
        let deserializer = serde_urlencoded::Deserializer::new(form_urlencoded_parse(query));
        serde_path_to_error::deserialize(deserializer).map(ApiQuery).map_err(|err| {
            let path = err.path().to_string();
            let path = if path == "." { String::new() } else { path };
            ApiError::field(ProblemType::BadQueryParameter, &path, err.into_inner().to_string())
        })
    }
}

fn form_urlencoded_parse(query: &str) -> form_urlencoded::Parse<'_> {
    form_urlencoded::parse(query.as_bytes())
}
