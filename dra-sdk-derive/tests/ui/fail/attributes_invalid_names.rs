use sdk::slices::DeviceAttributes;

#[derive(DeviceAttributes)]
#[dra(crate = "sdk")]
struct Gpu {
    #[dra(name = "pcie-root")]
    not_an_identifier: String,
    #[dra(name = "2nd")]
    starts_with_digit: i64,
    #[dra(name = "anAttributeNameLongerThan32Characters")]
    explicit_too_long: i64,
    a_field_name_much_longer_than_32_characters: i64,
    #[dra(name = "Resource.Kubernetes.io/pcieRoot")]
    uppercase_domain: String,
    #[dra(name = "example_com/x")]
    underscore_domain: String,
    #[dra(name = "a-very-long-domain-name-that-goes-on-and-on.and-on-and-on.example.com/x")]
    long_domain: String,
    #[dra(name = "example.com/")]
    empty_identifier: String,
    #[dra(name = "")]
    empty: String,
}

fn main() {}
