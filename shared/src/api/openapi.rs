//! `GET /openapi.json`: the OpenAPI 3.1 document of this API, converted from
//! `shared/openapi.yaml` to compact JSON at build time (see `build.rs`).

use std::sync::OnceLock;

use serde_json::Value;

use crate::api::{health, ApiResponse};

/// Where the document is served.
pub const PATH: &str = "/openapi.json";

/// The document as compact JSON.
pub fn openapi_json() -> &'static str {
    include_str!(concat!(env!("OUT_DIR"), "/openapi.json"))
}

/// The answer to `method` on `path` when `path` is the document's, else
/// `None` (the request is for the routes). GET and HEAD; any other method
/// is a 405.
pub fn respond(method: &str, path: &str) -> Option<ApiResponse> {
    if let Err(refused) = health::read_only(method, path, PATH)? {
        return Some(refused);
    }
    static DOCUMENT: OnceLock<Value> = OnceLock::new();
    let body = DOCUMENT.get_or_init(|| {
        // build.rs wrote this JSON itself; the test below parses it too.
        serde_json::from_str(openapi_json()).unwrap_or(Value::Null)
    });
    Some(ApiResponse {
        status: 200,
        body: body.clone(),
        allow: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn document() -> Value {
        serde_json::from_str(openapi_json()).expect("openapi.json parses")
    }

    #[test]
    fn is_openapi_3_1_and_compact() {
        let doc = document();
        assert_eq!(doc["openapi"], "3.1.0");
        assert!(!openapi_json().contains('\n'), "compact JSON");
        // Status codes are JSON strings even where the YAML left them unquoted.
        let responses = &doc["paths"]["/l/{id}"]["get"]["responses"];
        assert!(responses["200"].is_object());
    }

    #[test]
    fn lists_every_route_and_nothing_else() {
        // A new Route variant fails to compile there: describe it in openapi.yaml.
        let routes = super::super::routes::every_route();
        let doc = document();
        let mut expected: Vec<(String, String)> = routes
            .iter()
            .map(|route| {
                let (method, path) = route.key().split_once(' ').expect("METHOD /path");
                (path.to_string(), method.to_lowercase())
            })
            .collect();
        expected.push((PATH.to_string(), "get".to_string()));
        expected.push((super::super::health::PATH.to_string(), "get".to_string()));
        expected.sort();

        let mut listed = Vec::new();
        let paths = doc["paths"].as_object().expect("paths");
        for (path, item) in paths {
            for (key, operation) in item.as_object().expect("path item") {
                if key == "parameters" {
                    continue;
                }
                let responses = &operation["responses"];
                assert!(
                    responses["200"].is_object() || responses["202"].is_object(),
                    "{key} {path}"
                );
                listed.push((path.clone(), key.clone()));
            }
        }
        listed.sort();
        assert_eq!(listed, expected);
    }

    #[test]
    fn every_reference_resolves() {
        fn walk(value: &Value, doc: &Value) {
            match value {
                Value::Object(map) => {
                    if let Some(Value::String(reference)) = map.get("$ref") {
                        let pointer = reference.strip_prefix('#').expect("local $ref");
                        assert!(doc.pointer(pointer).is_some(), "dangling {reference}");
                    }
                    map.values().for_each(|v| walk(v, doc));
                }
                Value::Array(items) => items.iter().for_each(|v| walk(v, doc)),
                _ => {}
            }
        }
        let doc = document();
        walk(&doc, &doc);
    }

    #[test]
    fn served_on_get_and_head_only() {
        let ok = respond("GET", "/openapi.json?x=1").expect("served");
        assert_eq!(ok.status, 200);
        assert_eq!(ok.body, document());
        let http = ok.into_http();
        assert_eq!(http.headers()["content-type"], "application/json");

        let wrong = respond("POST", "/openapi.json").expect("answered");
        assert_eq!(wrong.status, 405);
        assert_eq!(wrong.into_http().headers()["allow"], "GET, HEAD");
        assert_eq!(
            respond("HEAD", "/openapi.json").expect("served").status,
            200
        );

        assert!(respond("GET", "/openapi.yaml").is_none());
        assert!(respond("GET", "/l/openapi.json").is_none());
    }

    /// The document and the wire model name the same fields: every field a
    /// body of the wire model has is a property of its schema, and the other
    /// way round, with the JSON type the schema says.
    #[test]
    fn schemas_match_the_wire_model() {
        use semaphore_wire::{
            BorrowBody, CallbackBody, Deleted, Delivery, EnqueueBody, Enqueued, ErrorBody, Grant,
            PoolState, RegisterBody, ReturnBody, Returned, Seconds, TicketStatus, Uuid,
        };
        let id = Uuid::new_v4();
        let json = |body: Result<Value, serde_json::Error>| body.expect("serializes");
        let fractional = Seconds::from_millis(1500);
        let samples = [
            (
                "RegisterRequest",
                json(serde_json::to_value(RegisterBody { count: 3 })),
            ),
            (
                "BorrowRequest",
                json(serde_json::to_value(BorrowBody {
                    ttl: fractional,
                    wait: Seconds::from_millis(2000),
                    lease: Some(id),
                })),
            ),
            (
                "ReturnRequest",
                json(serde_json::to_value(ReturnBody { lease: id })),
            ),
            (
                "Pool",
                json(serde_json::to_value(PoolState {
                    id,
                    count: 3,
                    in_use: 1,
                    available: 2,
                    waiting: Some(0),
                })),
            ),
            (
                "Lease",
                json(serde_json::to_value(Grant {
                    lease: id,
                    position: 0,
                    expires_at_unix: 1,
                    expires_in: fractional,
                    fence: Some(1),
                })),
            ),
            (
                "Deleted",
                json(serde_json::to_value(Deleted { deleted: true })),
            ),
            (
                "Returned",
                json(serde_json::to_value(Returned { returned: true })),
            ),
            (
                "Error",
                json(serde_json::to_value(ErrorBody { error: "x".into() })),
            ),
            (
                "EnqueueRequest",
                json(serde_json::to_value(EnqueueBody {
                    ttl: fractional,
                    wait: Some(fractional),
                    lease: id,
                    callback: CallbackBody {
                        url: "https://example.com/hook".into(),
                        token: "t".into(),
                    },
                })),
            ),
            (
                "Enqueued",
                json(serde_json::to_value(Enqueued {
                    ticket: 1,
                    ahead: 0,
                })),
            ),
            (
                "Ticket",
                json(serde_json::to_value(TicketStatus {
                    state: "failed".into(),
                    ticket: 1,
                    ahead: Some(0),
                    position: Some(0),
                    fence: Some(1),
                    expires_at_unix: Some(1),
                    expires_in: Some(fractional),
                    reason: Some("x".into()),
                })),
            ),
            (
                "Delivery",
                json(serde_json::to_value(Delivery {
                    ticket: 1,
                    position: 0,
                    fence: 1,
                    expires_at_unix: 1,
                    expires_in: fractional,
                })),
            ),
        ];
        let doc = document();
        let schemas = &doc["components"]["schemas"];
        for (name, sample) in samples {
            let schema = &schemas[name];
            let properties = schema["properties"].as_object().expect(name);
            let fields = sample.as_object().expect(name);
            let mut documented: Vec<&String> = properties.keys().collect();
            let mut sent: Vec<&String> = fields.keys().collect();
            documented.sort();
            sent.sort();
            assert_eq!(documented, sent, "{name}");
            for required in schema["required"].as_array().expect(name) {
                assert!(
                    fields.contains_key(required.as_str().expect(name)),
                    "{name}"
                );
            }
            for (field, value) in fields {
                // Through `allOf` (its first part) and `$ref` to the type.
                let mut property = &properties[field];
                loop {
                    if let Some(first) = property.get("allOf").and_then(|all| all.get(0)) {
                        property = first;
                    } else if let Some(Value::String(reference)) = property.get("$ref") {
                        property = doc
                            .pointer(reference.trim_start_matches('#'))
                            .expect("resolves");
                    } else {
                        break;
                    }
                }
                let kind = property["type"].as_str().expect("typed property");
                let fits = match kind {
                    "integer" => value.is_u64(),
                    "number" => value.is_number(),
                    "string" => value.is_string(),
                    "boolean" => value.is_boolean(),
                    "object" => value.is_object(),
                    other => panic!("{name}.{field}: type {other}"),
                };
                assert!(fits, "{name}.{field}: {value} is not {kind}");
            }
        }
    }
}
