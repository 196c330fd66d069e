//! Turns `openapi.yaml` into the compact JSON that `GET /openapi.json` serves
//! (`$OUT_DIR/openapi.json`, included by `src/api/openapi.rs`). Done here so
//! that no YAML parser is linked into the Lambda binaries.

use std::path::Path;

use serde_json::{Map, Number, Value};
use yaml_rust2::{Yaml, YamlLoader};

fn main() {
    println!("cargo:rerun-if-changed=openapi.yaml");
    println!("cargo:rerun-if-changed=build.rs");
    let source = std::fs::read_to_string("openapi.yaml")
        .unwrap_or_else(|e| panic!("cannot read shared/openapi.yaml: {e}"));
    let docs = YamlLoader::load_from_str(&source)
        .unwrap_or_else(|e| panic!("shared/openapi.yaml is not valid YAML: {e}"));
    let [doc] = docs.as_slice() else {
        panic!("shared/openapi.yaml must hold exactly one YAML document");
    };
    let json = to_json(doc, "").unwrap_or_else(|e| panic!("shared/openapi.yaml: {e}"));
    let out =
        Path::new(&std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("openapi.json");
    std::fs::write(&out, json.to_string())
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", out.display()));
}

/// YAML to JSON. `at` is the path so far, for error messages.
fn to_json(yaml: &Yaml, at: &str) -> Result<Value, String> {
    Ok(match yaml {
        Yaml::Null => Value::Null,
        Yaml::Boolean(b) => Value::Bool(*b),
        Yaml::Integer(i) => Value::from(*i),
        Yaml::Real(real) => real
            .parse::<f64>()
            .ok()
            .and_then(Number::from_f64)
            .map(Value::Number)
            .ok_or(format!("{at}: {real} is not a finite number"))?,
        Yaml::String(s) => Value::String(s.clone()),
        Yaml::Array(items) => Value::Array(
            items
                .iter()
                .enumerate()
                .map(|(i, item)| to_json(item, &format!("{at}/{i}")))
                .collect::<Result<_, _>>()?,
        ),
        Yaml::Hash(hash) => {
            let mut map = Map::new();
            for (key, value) in hash {
                // Unquoted status codes (`200:`) load as integers; JSON keys are strings.
                let key = match key {
                    Yaml::String(s) => s.clone(),
                    Yaml::Integer(i) => i.to_string(),
                    other => return Err(format!("{at}: unsupported key {other:?}")),
                };
                let value = to_json(value, &format!("{at}/{key}"))?;
                map.insert(key, value);
            }
            Value::Object(map)
        }
        Yaml::Alias(_) | Yaml::BadValue => return Err(format!("{at}: aliases are not supported")),
    })
}
