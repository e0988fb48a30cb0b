"""Routes of the billing API, mounted under /api/v1/."""

from django.urls import path

from billing.api import budget, views

urlpatterns = [
    path("usage", views.UsageView.as_view(), name="api-usage"),
    path("billing/budget", budget.BudgetView.as_view(), name="api-billing-budget"),
    path("invoices", views.InvoiceListView.as_view(), name="api-invoices"),
    path("invoices/<int:invoice_id>", views.InvoiceDetailView.as_view(), name="api-invoice"),
    path("operator/invoices/run", views.InvoiceRunView.as_view(), name="api-operator-invoice-run"),
    path(
        "operator/invoices/<int:invoice_id>/finalize",
        views.InvoiceFinalizeView.as_view(),
        name="api-operator-invoice-finalize",
    ),
]
