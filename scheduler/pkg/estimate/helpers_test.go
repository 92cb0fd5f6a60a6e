package estimate_test

import "k8s.io/apimachinery/pkg/api/resource"

func ptrQ(s string) *resource.Quantity {
	q := resource.MustParse(s)
	return &q
}
