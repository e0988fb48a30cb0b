"""Routes of the billing API, mounted under /api/v1/."""

from django.urls import path

from billing.api import budget, price_books, views

urlpatterns = [
    path("usage", views.UsageView.as_view(), name="api-usage"),
    path("billing/budget", budget.BudgetView.as_view(), name="api-billing-budget"),
    path("invoices", views.InvoiceListView.as_view(), name="api-invoices"),
    path("invoices/<int:invoice_id>", views.InvoiceDetailView.as_view(), name="api-invoice"),
    path("operator/invoices/run", views.InvoiceRunView.as_view(), name="api-operator-invoice-run"),
    path("operator/price-books", price_books.PriceBookListView.as_view(), name="api-operator-price-books"),
    path(
        "operator/price-books/<int:book_id>/prices",
        price_books.PriceScheduleView.as_view(),
        name="api-operator-price-book-prices",
    ),
    path(
        "operator/tenants/<int:tenant_id>/price-book",
        price_books.TenantPriceBookView.as_view(),
        name="api-operator-tenant-price-book",
    ),
    path(
        "operator/invoices/<int:invoice_id>/finalize",
        views.InvoiceFinalizeView.as_view(),
        name="api-operator-invoice-finalize",
    ),
]
