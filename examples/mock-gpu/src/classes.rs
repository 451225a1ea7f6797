//! The DeviceClasses of the mock GPU driver: the ones its Helm chart installs, built here too
//! so that tests and demos select devices with the same expressions (`tests/chart.rs` checks
//! that the chart renders exactly these).

use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, DeviceClass, DeviceClassSpec, DeviceSelector,
};
use kube::api::ObjectMeta;

use crate::PublishOptions;

/// The name of the DeviceClass of partitions (partitionable mode): `partition.<driver>`.
pub fn partition_class_name(driver_name: &str) -> String {
    format!("partition.{driver_name}")
}

/// The DeviceClasses for `driver_name`: `<driver>` for whole GPUs and, in partitionable mode,
/// [`partition_class_name`] for partitions. Two classes rather than one so that a claim for
/// "a GPU" never gets a partition by chance, and a request for all GPUs counts whole ones.
pub fn device_classes(driver_name: &str, options: PublishOptions) -> Vec<DeviceClass> {
    let of_driver = format!("device.driver == '{driver_name}'");
    let partition = format!("device.attributes[\"{driver_name}\"].partition");
    if options.partitions == 0 {
        return vec![class(driver_name, [of_driver])];
    }
    vec![
        class(
            driver_name,
            [of_driver.clone(), format!("!has({partition})")],
        ),
        class(
            &partition_class_name(driver_name),
            [of_driver, format!("has({partition})")],
        ),
    ]
}

fn class(name: &str, expressions: impl IntoIterator<Item = String>) -> DeviceClass {
    DeviceClass {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(DeviceClassSpec {
            selectors: Some(
                expressions
                    .into_iter()
                    .map(|expression| DeviceSelector {
                        cel: Some(CELDeviceSelector { expression }),
                    })
                    .collect(),
            ),
            ..DeviceClassSpec::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expressions(class: &DeviceClass) -> Vec<&str> {
        class
            .spec
            .iter()
            .flat_map(|spec| spec.selectors.iter().flatten())
            .filter_map(|s| s.cel.as_ref())
            .map(|cel| cel.expression.as_str())
            .collect()
    }

    #[test]
    fn one_class_without_partitions_two_with() {
        let plain = device_classes("gpu.example.com", PublishOptions::default());
        assert_eq!(plain.len(), 1);
        assert_eq!(
            expressions(&plain[0]),
            ["device.driver == 'gpu.example.com'"]
        );
        let options = PublishOptions {
            partitions: 2,
            ..PublishOptions::default()
        };
        let classes = device_classes("gpu.example.com", options);
        let names: Vec<_> = classes
            .iter()
            .map(|c| c.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["gpu.example.com", "partition.gpu.example.com"]);
        assert_eq!(
            expressions(&classes[0])[1],
            "!has(device.attributes[\"gpu.example.com\"].partition)"
        );
        assert_eq!(
            expressions(&classes[1])[1],
            "has(device.attributes[\"gpu.example.com\"].partition)"
        );
    }
}
