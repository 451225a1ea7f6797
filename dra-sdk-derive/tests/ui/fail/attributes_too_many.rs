use sdk::slices::DeviceAttributes;

/// 34 attributes: the 33rd field is reported.
#[derive(DeviceAttributes)]
#[dra(crate = "sdk")]
struct Gpu {
    field0: i64,
    field1: i64,
    field2: i64,
    field3: i64,
    field4: i64,
    field5: i64,
    field6: i64,
    field7: i64,
    field8: i64,
    field9: i64,
    field10: i64,
    field11: i64,
    field12: i64,
    field13: i64,
    field14: i64,
    field15: i64,
    field16: i64,
    field17: i64,
    field18: i64,
    field19: i64,
    field20: i64,
    field21: i64,
    field22: i64,
    field23: i64,
    field24: i64,
    field25: i64,
    field26: i64,
    field27: i64,
    field28: i64,
    field29: i64,
    field30: i64,
    field31: i64,
    field32: i64,
    field33: i64,
    #[dra(skip)]
    not_counted: i64,
}

fn main() {}
