//! The DRA CEL environment: the `device` variable and Kubernetes' quantity and semver libraries,
//! on top of the `cel` crate (cel-rust).
//!
//! `device` is a map with `driver` (string), `allowMultipleAllocations` (bool), `attributes` and
//! `capacity`. The last two map a domain to a map of names to values; a domain the device has
//! nothing in yields an empty map, so `device.attributes["other.example.com"].x` fails with
//! "no such key" (like the scheduler's environment) and `has(...)` on it is `false`.

use std::any::Any;
use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::Arc;

use cel::common::traits::{Container, Indexer, Iterable, Sizer};
use cel::common::types::{CelBool, CelDouble, CelInt, CelList, CelMap, CelMapKey, CelString, Type};
use cel::common::value::{CowVal, StaticVal, Val};
use cel::{Context, DeclarationError, Env, ExecutionError, Program, Value};

use super::index::AttributeValue;
use super::model;
use dra_sdk::k8s::{QuantityValue as Quantity, Semver};

static QUANTITY_TYPE: Type = Type::new_unspecified_type("kubernetes.Quantity");
static SEMVER_TYPE: Type = Type::new_unspecified_type("kubernetes.Semver");

/// A Kubernetes quantity as a CEL value.
#[derive(Clone, Debug)]
struct QuantityVal(Quantity);

impl Val for QuantityVal {
    fn get_type(&self) -> &Type {
        &QUANTITY_TYPE
    }

    fn cel_type() -> &'static Type {
        &QUANTITY_TYPE
    }

    fn equals(&self, other: &dyn Val) -> bool {
        // Semantic equality: `quantity("1Ki") == quantity("1024")`.
        other
            .downcast_ref::<QuantityVal>()
            .is_some_and(|other| other.0 == self.0)
    }

    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v> {
        Box::new(self.clone())
    }

    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }
}

impl StaticVal for QuantityVal {}

/// A semantic version as a CEL value.
#[derive(Clone, Debug)]
struct SemverVal(Semver);

impl Val for SemverVal {
    fn get_type(&self) -> &Type {
        &SEMVER_TYPE
    }

    fn cel_type() -> &'static Type {
        &SEMVER_TYPE
    }

    fn equals(&self, other: &dyn Val) -> bool {
        other
            .downcast_ref::<SemverVal>()
            .is_some_and(|other| other.0 == self.0)
    }

    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v> {
        Box::new(self.clone())
    }

    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }
}

impl StaticVal for SemverVal {}

/// `device.attributes` / `device.capacity`: a map of domains whose missing keys read as an
/// empty map rather than an error.
#[derive(Clone, Debug, Default)]
struct DomainMap {
    domains: CelMap<'static>,
    empty: CelMap<'static>,
}

impl Indexer for DomainMap {
    fn get<'b, 'v>(&'b self, index: &dyn Val) -> Result<CowVal<'b, 'v>, ExecutionError>
    where
        Self: 'v,
    {
        match self.domains.get(index) {
            Err(ExecutionError::NoSuchKey(_)) => Ok(CowVal::Borrowed(&self.empty)),
            found => found,
        }
    }

    fn steal<'v>(self: Box<Self>, index: &dyn Val) -> Result<Box<dyn Val + 'v>, ExecutionError>
    where
        Self: 'v,
    {
        self.get(index).map(CowVal::into_owned)
    }
}

impl Val for DomainMap {
    fn get_type(&self) -> &Type {
        self.domains.get_type()
    }

    fn cel_type() -> &'static Type {
        <CelMap<'static> as Val>::cel_type()
    }

    fn as_indexer<'b, 'v>(&'b self) -> Option<&'b (dyn Indexer + 'v)>
    where
        Self: 'v,
    {
        Some(self)
    }

    fn as_container(&self) -> Option<&dyn Container> {
        self.domains.as_container()
    }

    fn as_iterable<'b, 'v>(&'b self) -> Option<&'b (dyn Iterable + 'v)>
    where
        Self: 'v,
    {
        self.domains.as_iterable()
    }

    fn as_sizer(&self) -> Option<&dyn Sizer> {
        self.domains.as_sizer()
    }

    fn equals(&self, other: &dyn Val) -> bool {
        other
            .downcast_ref::<DomainMap>()
            .is_some_and(|other| self.domains.equals(&other.domains))
    }

    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v> {
        Box::new(self.clone())
    }

    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }
}

impl StaticVal for DomainMap {}

// --- the Kubernetes quantity library ---

fn quantity_error(function: &str, error: impl ToString) -> ExecutionError {
    ExecutionError::function_error(function, error)
}

fn quantity(input: &CelString<'_>) -> Result<QuantityVal, ExecutionError> {
    Quantity::parse(input.inner())
        .map(QuantityVal)
        .map_err(|error| quantity_error("quantity", error))
}

fn is_quantity(input: &CelString<'_>) -> CelBool {
    CelBool::from(Quantity::parse(input.inner()).is_ok())
}

fn quantity_sign(this: &QuantityVal) -> CelInt {
    CelInt::from(this.0.sign())
}

fn quantity_is_integer(this: &QuantityVal) -> CelBool {
    CelBool::from(this.0.as_integer().is_some())
}

fn quantity_as_integer(this: &QuantityVal) -> Result<CelInt, ExecutionError> {
    this.0.as_integer().map(CelInt::from).ok_or_else(|| {
        quantity_error(
            "asInteger",
            format!("cannot convert value {} to an integer", this.0),
        )
    })
}

fn quantity_as_approximate_float(this: &QuantityVal) -> CelDouble {
    CelDouble::from(this.0.as_approximate_float())
}

fn quantity_add(this: &QuantityVal, other: &QuantityVal) -> Result<QuantityVal, ExecutionError> {
    this.0
        .checked_add(other.0)
        .map(QuantityVal)
        .ok_or_else(|| quantity_error("add", "overflow"))
}

fn quantity_add_int(this: &QuantityVal, other: &CelInt) -> Result<QuantityVal, ExecutionError> {
    quantity_add(this, &QuantityVal(Quantity::from_int(*other.inner())))
}

fn quantity_sub(this: &QuantityVal, other: &QuantityVal) -> Result<QuantityVal, ExecutionError> {
    this.0
        .checked_sub(other.0)
        .map(QuantityVal)
        .ok_or_else(|| quantity_error("sub", "overflow"))
}

fn quantity_sub_int(this: &QuantityVal, other: &CelInt) -> Result<QuantityVal, ExecutionError> {
    quantity_sub(this, &QuantityVal(Quantity::from_int(*other.inner())))
}

fn quantity_is_less_than(this: &QuantityVal, other: &QuantityVal) -> CelBool {
    CelBool::from(this.0 < other.0)
}

fn quantity_is_greater_than(this: &QuantityVal, other: &QuantityVal) -> CelBool {
    CelBool::from(this.0 > other.0)
}

fn ordering_to_int(ordering: Ordering) -> CelInt {
    CelInt::from(match ordering {
        Ordering::Less => -1,
        Ordering::Equal => 0,
        Ordering::Greater => 1,
    })
}

fn quantity_compare_to(this: &QuantityVal, other: &QuantityVal) -> CelInt {
    ordering_to_int(this.0.cmp(&other.0))
}

// --- the Kubernetes semver library ---

fn semver(input: &CelString<'_>) -> Result<SemverVal, ExecutionError> {
    Semver::parse(input.inner())
        .map(SemverVal)
        .map_err(|error| ExecutionError::function_error("semver", error))
}

fn semver_normalized(
    input: &CelString<'_>,
    normalize: &CelBool,
) -> Result<SemverVal, ExecutionError> {
    let parsed = if *normalize.inner() {
        Semver::parse_normalized(input.inner())
    } else {
        Semver::parse(input.inner())
    };
    parsed
        .map(SemverVal)
        .map_err(|error| ExecutionError::function_error("semver", error))
}

fn is_semver(input: &CelString<'_>) -> CelBool {
    CelBool::from(Semver::parse(input.inner()).is_ok())
}

fn is_semver_normalized(input: &CelString<'_>, normalize: &CelBool) -> CelBool {
    let parsed = if *normalize.inner() {
        Semver::parse_normalized(input.inner())
    } else {
        Semver::parse(input.inner())
    };
    CelBool::from(parsed.is_ok())
}

fn semver_number(value: u64) -> CelInt {
    // Versions beyond i64::MAX do not occur in practice; saturate rather than wrap.
    CelInt::from(i64::try_from(value).unwrap_or(i64::MAX))
}

fn semver_major(this: &SemverVal) -> CelInt {
    semver_number(this.0.major())
}

fn semver_minor(this: &SemverVal) -> CelInt {
    semver_number(this.0.minor())
}

fn semver_patch(this: &SemverVal) -> CelInt {
    semver_number(this.0.patch())
}

fn semver_is_less_than(this: &SemverVal, other: &SemverVal) -> CelBool {
    CelBool::from(this.0 < other.0)
}

fn semver_is_greater_than(this: &SemverVal, other: &SemverVal) -> CelBool {
    CelBool::from(this.0 > other.0)
}

fn semver_compare_to(this: &SemverVal, other: &SemverVal) -> CelInt {
    ordering_to_int(this.0.cmp(&other.0))
}

fn kubernetes_libraries(env: &mut Env) -> Result<(), DeclarationError> {
    cel::add_overload!(env, fn quantity: (CelString<'_>) -> Result<QuantityVal>)?;
    cel::add_overload!(env, fn is_quantity: (CelString<'_>) -> CelBool)?;
    cel::add_member_overload!(env, fn quantity_sign: (QuantityVal) -> CelInt, name = "sign")?;
    cel::add_member_overload!(env, fn quantity_is_integer: (QuantityVal) -> CelBool, name = "isInteger")?;
    cel::add_member_overload!(env, fn quantity_as_integer: (QuantityVal) -> Result<CelInt>, name = "asInteger")?;
    cel::add_member_overload!(
        env,
        fn quantity_as_approximate_float: (QuantityVal) -> CelDouble,
        name = "asApproximateFloat"
    )?;
    cel::add_member_overload!(env, fn quantity_add: (QuantityVal, QuantityVal) -> Result<QuantityVal>, name = "add")?;
    cel::add_member_overload!(env, fn quantity_add_int: (QuantityVal, CelInt) -> Result<QuantityVal>, name = "add")?;
    cel::add_member_overload!(env, fn quantity_sub: (QuantityVal, QuantityVal) -> Result<QuantityVal>, name = "sub")?;
    cel::add_member_overload!(env, fn quantity_sub_int: (QuantityVal, CelInt) -> Result<QuantityVal>, name = "sub")?;
    cel::add_member_overload!(
        env,
        fn quantity_is_less_than: (QuantityVal, QuantityVal) -> CelBool,
        name = "isLessThan"
    )?;
    cel::add_member_overload!(
        env,
        fn quantity_is_greater_than: (QuantityVal, QuantityVal) -> CelBool,
        name = "isGreaterThan"
    )?;
    cel::add_member_overload!(env, fn quantity_compare_to: (QuantityVal, QuantityVal) -> CelInt, name = "compareTo")?;

    cel::add_overload!(env, fn semver: (CelString<'_>) -> Result<SemverVal>)?;
    cel::add_overload!(env, fn semver_normalized: (CelString<'_>, CelBool) -> Result<SemverVal>, name = "semver")?;
    cel::add_overload!(env, fn is_semver: (CelString<'_>) -> CelBool)?;
    cel::add_overload!(env, fn is_semver_normalized: (CelString<'_>, CelBool) -> CelBool, name = "isSemver")?;
    cel::add_member_overload!(env, fn semver_major: (SemverVal) -> CelInt, name = "major")?;
    cel::add_member_overload!(env, fn semver_minor: (SemverVal) -> CelInt, name = "minor")?;
    cel::add_member_overload!(env, fn semver_patch: (SemverVal) -> CelInt, name = "patch")?;
    cel::add_member_overload!(env, fn semver_is_less_than: (SemverVal, SemverVal) -> CelBool, name = "isLessThan")?;
    cel::add_member_overload!(
        env,
        fn semver_is_greater_than: (SemverVal, SemverVal) -> CelBool,
        name = "isGreaterThan"
    )?;
    cel::add_member_overload!(env, fn semver_compare_to: (SemverVal, SemverVal) -> CelInt, name = "compareTo")?;
    Ok(())
}

/// The compiled-expression environment shared by all evaluations of one [`Allocator`].
///
/// [`Allocator`]: super::Allocator
pub(crate) struct CelEnvironment {
    env: Arc<Env>,
}

impl std::fmt::Debug for CelEnvironment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CelEnvironment").finish_non_exhaustive()
    }
}

impl CelEnvironment {
    /// The CEL standard library, cel-rust's strings and lists extensions, and the Kubernetes
    /// quantity and semver libraries.
    pub(crate) fn new() -> Result<Self, String> {
        let mut env = Env::stdlib();
        env.add_extension(cel::extensions::strings)
            .map_err(|e| e.to_string())?;
        env.add_extension(cel::extensions::lists)
            .map_err(|e| e.to_string())?;
        env.add_extension(kubernetes_libraries)
            .map_err(|e| e.to_string())?;
        Ok(Self { env: Arc::new(env) })
    }

    /// Parses an expression.
    pub(crate) fn compile(&self, expression: &str) -> Result<Program, String> {
        self.env
            .compile(expression)
            .map_err(|errors| errors.to_string())
    }

    /// The evaluation context of one device: the `device` variable.
    ///
    /// Fails like the scheduler when an attribute cannot be represented (a malformed version).
    pub(crate) fn device_context(
        &self,
        driver: &str,
        device: &model::Device,
    ) -> Result<Context<'static, 'static>, String> {
        let mut attributes: HashMap<String, HashMap<CelMapKey<'static>, Box<dyn Val>>> =
            HashMap::new();
        for (name, attribute) in &device.attributes {
            let value =
                attribute_value(attribute).map_err(|error| format!("attribute {name}: {error}"))?;
            let (domain, id) = split_qualified_name(name, driver);
            attributes
                .entry(domain.to_owned())
                .or_default()
                .insert(CelMapKey::from(id.to_owned()), value);
        }
        let mut capacity: HashMap<String, HashMap<CelMapKey<'static>, Box<dyn Val>>> =
            HashMap::new();
        for (name, entry) in &device.capacity {
            let value = Quantity::parse(&entry.value)
                .map_err(|error| format!("capacity {name}: {error}"))?;
            let (domain, id) = split_qualified_name(name, driver);
            capacity
                .entry(domain.to_owned())
                .or_default()
                .insert(CelMapKey::from(id.to_owned()), Box::new(QuantityVal(value)));
        }
        let domain_map =
            |domains: HashMap<String, HashMap<CelMapKey<'static>, Box<dyn Val>>>| -> Box<dyn Val> {
                let domains: HashMap<CelMapKey<'static>, Box<dyn Val>> = domains
                    .into_iter()
                    .map(|(domain, ids)| {
                        (
                            CelMapKey::from(domain),
                            Box::new(CelMap::from(ids)) as Box<dyn Val>,
                        )
                    })
                    .collect();
                Box::new(DomainMap {
                    domains: CelMap::from(domains),
                    empty: CelMap::default(),
                })
            };
        let mut fields: HashMap<CelMapKey<'static>, Box<dyn Val>> = HashMap::new();
        fields.insert(
            CelMapKey::from("driver".to_owned()),
            Box::new(CelString::from(driver.to_owned())),
        );
        fields.insert(
            CelMapKey::from("allowMultipleAllocations".to_owned()),
            Box::new(CelBool::from(
                device.allow_multiple_allocations.unwrap_or(false),
            )),
        );
        fields.insert(
            CelMapKey::from("attributes".to_owned()),
            domain_map(attributes),
        );
        fields.insert(CelMapKey::from("capacity".to_owned()), domain_map(capacity));
        let mut context = Context::with_env(Arc::clone(&self.env));
        context.add_variable_as_val("device", Box::new(CelMap::from(fields)));
        Ok(context)
    }
}

/// Evaluates a selector against a device's context.
pub(crate) fn device_matches(program: &Program, context: &Context<'_, '_>) -> Result<bool, String> {
    match program.execute(context) {
        Ok(Value::Bool(matches)) => Ok(matches),
        Ok(other) => Err(format!(
            "CEL result of type {} could not be converted to bool",
            other.type_of()
        )),
        Err(error) => Err(lowercase_first(&error.to_string())),
    }
}

/// Evaluates a derived attribute (`derivedAttributes`, Kubernetes 1.37) against a device's
/// context: a string, int or bool, or a list of them, as constraints compare values (a scalar
/// is a one-element set). Any other result is an error, as in the scheduler.
///
/// A semver result is reported as an error too: cel-rust cannot hand a value of the
/// Kubernetes semver type out of an evaluation (the test kit's gap; the scheduler accepts it).
pub(crate) fn derived_value(
    program: &Program,
    context: &Context<'_, '_>,
) -> Result<Vec<AttributeValue>, String> {
    fn scalar(value: &Value) -> Option<AttributeValue> {
        match value {
            Value::Int(v) => Some(AttributeValue::Int(*v)),
            Value::Bool(v) => Some(AttributeValue::Bool(*v)),
            Value::String(v) => Some(AttributeValue::String(v.as_str().to_owned())),
            _ => None,
        }
    }
    let unsupported = |value: &Value| {
        format!(
            "CEL result of type {} is not a string, int, bool, semver or a list of them",
            value.type_of()
        )
    };
    let value = program
        .execute(context)
        .map_err(|error| lowercase_first(&error.to_string()))?;
    if let Value::List(items) = &value {
        return items
            .iter()
            .map(|item| scalar(item).ok_or_else(|| unsupported(item)))
            .collect();
    }
    scalar(&value)
        .map(|value| vec![value])
        .ok_or_else(|| unsupported(&value))
}

/// cel-rust capitalizes its messages ("No such key: x"); cel-go, whose text users search for,
/// does not ("no such key: x").
fn lowercase_first(message: &str) -> String {
    let mut chars = message.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// `domain/id` or, for an unqualified name, the driver's domain and the name.
pub(crate) fn split_qualified_name<'a>(name: &'a str, driver: &'a str) -> (&'a str, &'a str) {
    name.split_once('/').unwrap_or((driver, name))
}

fn attribute_value(attribute: &model::Attribute) -> Result<Box<dyn Val>, String> {
    fn list(values: Vec<Box<dyn Val>>) -> Box<dyn Val> {
        Box::new(CelList::from(values))
    }
    fn version(text: &str) -> Result<Box<dyn Val>, String> {
        Semver::parse(text)
            .map(|v| Box::new(SemverVal(v)) as Box<dyn Val>)
            .map_err(|e| e.to_string())
    }
    if let Some(values) = &attribute.ints {
        return Ok(list(
            values
                .iter()
                .map(|v| Box::new(CelInt::from(*v)) as Box<dyn Val>)
                .collect(),
        ));
    }
    if let Some(values) = &attribute.bools {
        return Ok(list(
            values
                .iter()
                .map(|v| Box::new(CelBool::from(*v)) as Box<dyn Val>)
                .collect(),
        ));
    }
    if let Some(values) = &attribute.strings {
        return Ok(list(
            values
                .iter()
                .map(|v| Box::new(CelString::from(v.clone())) as Box<dyn Val>)
                .collect(),
        ));
    }
    if let Some(values) = &attribute.versions {
        return Ok(list(
            values
                .iter()
                .map(|v| version(v))
                .collect::<Result<_, _>>()?,
        ));
    }
    if let Some(value) = attribute.int {
        return Ok(Box::new(CelInt::from(value)));
    }
    if let Some(value) = attribute.bool {
        return Ok(Box::new(CelBool::from(value)));
    }
    if let Some(value) = &attribute.string {
        return Ok(Box::new(CelString::from(value.clone())));
    }
    if let Some(value) = &attribute.version {
        return version(value);
    }
    Err("unsupported attribute value".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device() -> model::Device {
        serde_json::from_value(serde_json::json!({
            "name": "gpu-0",
            "allowMultipleAllocations": true,
            "attributes": {
                "model": { "string": "a100" },
                "index": { "int": 3 },
                "healthy": { "bool": true },
                "driverVersion": { "version": "1.10.0" },
                "resource.kubernetes.io/pcieRoot": { "string": "pci0000:00" },
                "cores": { "ints": [0, 1, 2] },
            },
            "capacity": {
                "memory": { "value": "40Gi" },
                "example.com/bandwidth": { "value": "1500m" },
            },
        }))
        .unwrap()
    }

    fn eval(expression: &str) -> Result<bool, String> {
        let env = CelEnvironment::new().unwrap();
        let program = env.compile(expression)?;
        let context = env.device_context("gpu.example.com", &device()).unwrap();
        device_matches(&program, &context)
    }

    #[test]
    fn device_variables() {
        for expression in [
            r#"device.driver == "gpu.example.com""#,
            "device.allowMultipleAllocations",
            r#"device.attributes["gpu.example.com"].model == "a100""#,
            r#"device.attributes["gpu.example.com"].index > 2"#,
            r#"device.attributes["gpu.example.com"].healthy"#,
            r#"device.attributes["resource.kubernetes.io"].pcieRoot.startsWith("pci0000")"#,
            r#"device.attributes["gpu.example.com"].cores.exists(c, c == 2)"#,
            r#"2 in device.attributes["gpu.example.com"].cores"#,
            r#""gpu.example.com" in device.attributes"#,
            r#"!("other.example.com" in device.attributes)"#,
            r#"!has(device.attributes["other.example.com"].model)"#,
            r#"has(device.attributes["gpu.example.com"].model)"#,
            r#"size(device.attributes["gpu.example.com"]) == 5"#,
            r#"device.attributes["gpu.example.com"].model.matches("^a[0-9]+$")"#,
            r#"device.attributes["gpu.example.com"].model.upperAscii() == "A100""#,
        ] {
            assert_eq!(eval(expression), Ok(true), "{expression}");
        }
    }

    #[test]
    fn quantity_library() {
        for expression in [
            r#"device.capacity["gpu.example.com"].memory.compareTo(quantity("40Gi")) == 0"#,
            r#"device.capacity["gpu.example.com"].memory.isGreaterThan(quantity("10Gi"))"#,
            r#"device.capacity["gpu.example.com"].memory.isLessThan(quantity("41Gi"))"#,
            r#"device.capacity["gpu.example.com"].memory == quantity("40960Mi")"#,
            r#"device.capacity["gpu.example.com"].memory.asInteger() == 42949672960"#,
            r#"device.capacity["example.com"].bandwidth.asApproximateFloat() == 1.5"#,
            r#"!device.capacity["example.com"].bandwidth.isInteger()"#,
            r#"device.capacity["example.com"].bandwidth.add(quantity("500m")) == quantity("2")"#,
            r#"device.capacity["example.com"].bandwidth.add(1).sub(2).sign() == 1"#,
            r#"quantity("1k").sub(quantity("2k")).sign() == -1"#,
            r#"isQuantity("10Gi") && !isQuantity("ten")"#,
        ] {
            assert_eq!(eval(expression), Ok(true), "{expression}");
        }
    }

    #[test]
    fn semver_library() {
        for expression in [
            r#"device.attributes["gpu.example.com"].driverVersion.isGreaterThan(semver("1.9.0"))"#,
            r#"device.attributes["gpu.example.com"].driverVersion.isLessThan(semver("1.10.1"))"#,
            r#"device.attributes["gpu.example.com"].driverVersion.compareTo(semver("1.10.0")) == 0"#,
            r#"device.attributes["gpu.example.com"].driverVersion == semver("1.10.0")"#,
            r#"device.attributes["gpu.example.com"].driverVersion.minor() == 10"#,
            r#"semver("v2", true).major() == 2"#,
            r#"isSemver("1.2.3") && !isSemver("v1.2.3") && isSemver("v1.2.3", true)"#,
        ] {
            assert_eq!(eval(expression), Ok(true), "{expression}");
        }
    }

    #[test]
    fn errors() {
        let missing = eval(r#"device.attributes["gpu.example.com"].vendor == "x""#).unwrap_err();
        assert!(missing.starts_with("no such key"), "{missing}");
        let bad = eval(r#"quantity("lots").sign() == 1"#).unwrap_err();
        assert!(bad.contains("lots"), "{bad}");
        let not_bool = eval("device.driver").unwrap_err();
        assert!(
            not_bool.contains("could not be converted to bool"),
            "{not_bool}"
        );
        assert!(
            CelEnvironment::new()
                .unwrap()
                .compile("device.driver ==")
                .is_err()
        );
    }

    #[test]
    fn malformed_version_attribute_is_an_evaluation_error() {
        let mut device = device();
        device.attributes.insert(
            "broken".into(),
            serde_json::from_value(serde_json::json!({"version": "1.0"})).unwrap(),
        );
        let Err(error) = CelEnvironment::new()
            .unwrap()
            .device_context("gpu.example.com", &device)
        else {
            panic!("a malformed version must not evaluate");
        };
        assert!(error.starts_with("attribute broken:"), "{error}");
    }
}
